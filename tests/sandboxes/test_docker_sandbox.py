"""Functional tests of DockerSandbox and SandboxSettings against the real Docker engine."""

from __future__ import annotations

import asyncio
import io
import tarfile
import time
import uuid

import pytest

from sandboxes.docker import DockerSandbox, owner_id
from sandboxes.docker_api import DockerAPI, DockerError
from sandboxes.hardening import SECURITY_FIELDS, SandboxSettings
from sandboxes.protocol import ImageMissing, Sandbox, SandboxDied, SandboxError, SandboxUnavailable
from tests.sandboxes.conftest import RUN_LABEL, leftover_containers

pytestmark = pytest.mark.timeout(60)


def make_tar(members: dict[str, bytes], *, mode: int = 0o644) -> bytes:
    """An uncompressed tar of regular files, name -> content."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_files(archive: bytes) -> dict[str, bytes]:
    """name -> content of the regular files in a tar."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


# ---------------------------------------------------------------- exec


async def test_implements_the_sandbox_protocol(sandbox):
    assert isinstance(sandbox, Sandbox)


async def test_exec_string_runs_in_shell_with_separate_streams(sandbox):
    r = await sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code) == (b"out\n", b"err\n", 3), r
    assert not r.ok and not r.timed_out and not r.truncated and not r.oom_killed
    assert 0 <= r.duration < 2.0, r.duration


async def test_exec_argv_is_not_shell_expanded(sandbox):
    """An argv list reaches the program verbatim: spaces, $VARS and globs stay literal."""
    args = ["a b", "$HOME", "*", "'q'"]
    r = await sandbox.exec(["python3", "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *args])
    assert r.ok, r
    assert r.stdout.decode().strip() == '["a b", "$HOME", "*", "\'q\'"]', r.stdout


async def test_exec_cwd_env_and_defaults(sandbox):
    """Default cwd is /workspace and HOME is /tmp; cwd and env apply per call."""
    r = await sandbox.exec("pwd; echo $HOME")
    assert r.stdout == b"/workspace\n/tmp\n", r
    r = await sandbox.exec('pwd; printf %s "$FOO"', cwd="/tmp", env={"FOO": "bar baz"})
    assert r.stdout == b"/tmp\nbar baz", r
    r = await sandbox.exec('printf %s "${FOO-unset}"')
    assert r.stdout == b"unset", "env leaked from one call to the next"


async def test_exec_missing_cwd_or_program_exit_127(sandbox):
    r = await sandbox.exec("true", cwd="/workspace/nope")
    assert r.exit_code == 127 and b"/workspace/nope" in r.stderr, r
    r = await sandbox.exec(["no-such-program-xyz"])
    assert r.exit_code == 127 and b"no-such-program-xyz" in r.stderr, r


async def test_exec_stdin_binary_round_trip(sandbox):
    data = bytes(range(256)) * 64
    r = await sandbox.exec(["cat"], stdin=data)
    assert r.ok and r.stdout == data, f"stdin round trip lost data ({len(r.stdout)} bytes back)"
    r = await sandbox.exec("wc -l", stdin=b"one\ntwo\n")
    assert r.stdout.strip() == b"2", r


async def test_a_command_that_closes_its_output_before_exiting_keeps_its_exit_code(sandbox):
    """cat closes stdout before it exits; the agent must not kill it in between and report -9."""
    codes = [(await sandbox.exec(["cat"], stdin=b"x" * 4096)).exit_code for _ in range(100)]
    assert codes == [0] * 100, sorted(set(codes))


async def test_exec_without_stdin_sees_eof(sandbox):
    """A command reading stdin must not hang when none is given."""
    r = await sandbox.exec("cat; echo done", timeout=5)
    assert r.ok and r.stdout == b"done\n", r


async def test_exec_exit_by_signal_is_negative(sandbox):
    r = await sandbox.exec("kill -TERM $$")
    assert r.exit_code == -15 and not r.timed_out, r


async def test_exec_rejects_bad_arguments(sandbox):
    with pytest.raises(ValueError, match="cmd"):
        await sandbox.exec([])
    with pytest.raises(ValueError, match="cmd"):
        await sandbox.exec(["echo", 1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="timeout"):
        await sandbox.exec("true", timeout=0)


async def test_concurrent_execs_on_one_sandbox(sandbox):
    """Ten overlapping calls each get their own answer, and run in parallel."""
    t0 = time.monotonic()
    results = await asyncio.gather(*(sandbox.exec(f"sleep 0.3; echo {i}; echo e{i} >&2") for i in range(10)))
    elapsed = time.monotonic() - t0
    for i, r in enumerate(results):
        assert (r.stdout, r.stderr, r.exit_code) == (f"{i}\n".encode(), f"e{i}\n".encode(), 0), (i, r)
    assert elapsed < 2.0, f"10 x 0.3 s took {elapsed:.2f}s: calls were serialized"


# ---------------------------------------------------------------- files


async def test_write_read_file_round_trip_binary_and_mode(sandbox):
    data = bytes(range(256)) * 1000
    await sandbox.write_file("/workspace/deep/er/blob.bin", data, mode=0o600)
    assert await sandbox.read_file("/workspace/deep/er/blob.bin") == data
    await sandbox.write_file("/tmp/run.sh", b"#!/bin/sh\necho hi\n", mode=0o755)
    r = await sandbox.exec("stat -c '%a %u' /workspace/deep/er/blob.bin /tmp/run.sh")
    uid = str(sandbox.uid).encode()
    assert r.stdout.split(b"\n")[:2] == [b"600 " + uid, b"755 " + uid], r
    await sandbox.write_file("/workspace/empty", b"")
    assert await sandbox.read_file("/workspace/empty") == b""


async def test_write_file_strips_setuid_bits(sandbox):
    await sandbox.write_file("/tmp/s", b"x", mode=0o4755)
    assert (await sandbox.exec("stat -c %a /tmp/s")).stdout.strip() == b"755"


async def test_read_file_errors(sandbox):
    with pytest.raises(FileNotFoundError, match="/workspace/missing"):
        await sandbox.read_file("/workspace/missing")
    with pytest.raises(IsADirectoryError):
        await sandbox.read_file("/workspace")
    await sandbox.write_file("/tmp/ten", b"0123456789")
    with pytest.raises(ValueError, match="larger than 9 bytes"):
        await sandbox.read_file("/tmp/ten", max_bytes=9)
    assert await sandbox.read_file("/tmp/ten", max_bytes=10) == b"0123456789"


async def test_upload_directory_and_download_round_trip(sandbox, tmp_path):
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "README").write_text("hello\n")
    (src / "pkg" / "data.bin").write_bytes(bytes(range(256)))
    await sandbox.upload(src, "/workspace/proj")
    assert await sandbox.read_file("/workspace/proj/pkg/data.bin") == bytes(range(256))
    r = await sandbox.exec("stat -c %u /workspace/proj/README")
    assert r.stdout.strip() == str(sandbox.uid).encode(), "uploaded files must belong to the sandbox user"

    files = tar_files(await sandbox.download("/workspace/proj"))
    assert files == {"proj/README": b"hello\n", "proj/pkg/data.bin": bytes(range(256))}, files
    assert tar_files(await sandbox.download("/workspace/proj/README")) == {"README": b"hello\n"}


async def test_upload_single_file(sandbox, tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("1")
    await sandbox.upload(f, "/tmp/in")
    assert await sandbox.read_file("/tmp/in/one.txt") == b"1"


async def test_upload_tar_bytes(sandbox):
    await sandbox.upload(make_tar({"a/b.txt": b"B", "c.txt": b"C"}), "/workspace/t")
    assert await sandbox.read_file("/workspace/t/a/b.txt") == b"B"
    assert await sandbox.read_file("/workspace/t/c.txt") == b"C"


async def test_upload_strips_setuid_bits(sandbox):
    await sandbox.upload(make_tar({"tool": b"#!/bin/sh\n"}, mode=0o4755), "/workspace/s")
    assert (await sandbox.exec("stat -c %a /workspace/s/tool")).stdout.strip() == b"755"


def _symlink_tar(name: str, target: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = tarfile.SYMTYPE, target
        tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize(
    "archive",
    [
        make_tar({"ok.txt": b"fine", "../escape": b"pwned"}),
        make_tar({"ok.txt": b"fine", "sub/../../escape": b"pwned"}),
        make_tar({"ok.txt": b"fine", "/workspace/escape": b"pwned"}),
        _symlink_tar("link", "/workspace/escape"),
        _symlink_tar("link", "../escape"),
    ],
    ids=["dotdot", "nested-dotdot", "absolute", "abs-symlink", "rel-symlink"],
)
async def test_upload_rejects_members_outside_dest(sandbox, archive):
    """The whole archive is refused before anything is written."""
    with pytest.raises(ValueError, match="outside"):
        await sandbox.upload(archive, "/workspace/dest")
    r = await sandbox.exec("ls -A /workspace/dest; ls /workspace/escape")
    assert r.stdout == b"", f"something was extracted: {r.stdout!r}"
    assert b"No such file" in r.stderr, r.stderr


async def test_upload_rejects_symlink_chain_escape(sandbox):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, target in (("x", "."), ("x/y", ".."), ("x/y/w", "..")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        info = tarfile.TarInfo("x/y/w/tmp/escaped")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"pwned"))
    with pytest.raises(ValueError):
        await sandbox.upload(buf.getvalue(), "/workspace/dest")
    assert not (await sandbox.exec("test -e /tmp/escaped")).ok, "upload wrote /tmp/escaped"


async def test_download_missing_path(sandbox):
    with pytest.raises(FileNotFoundError):
        await sandbox.download("/workspace/nothing")


# ---------------------------------------------------------------- settings


def test_settings_network_needs_loosen():
    with pytest.raises(ValueError, match="network"):
        SandboxSettings(network=True)
    opened = SandboxSettings(network=True, loosen=frozenset({"network"}))
    config = opened.container_config(cmd=["x"], labels={}, uid=200_000)
    assert config["HostConfig"]["NetworkMode"] == "bridge" and config["NetworkDisabled"] is False


@pytest.mark.parametrize(
    "change",
    [
        {"read_only_root": False},
        {"user": "0:0"},
        {"cap_add": ("SYS_ADMIN",)},
        {"no_new_privileges": False},
        {"pids_limit": 100_000},
    ],
    ids=lambda c: next(iter(c)),
)
def test_settings_weakening_any_security_field_needs_loosen(change):
    (name,) = change
    with pytest.raises(ValueError, match=name):
        SandboxSettings(**change)
    SandboxSettings(**change, loosen=frozenset({name}))  # named: allowed


def test_settings_tightening_needs_no_loosen():
    s = SandboxSettings(pids_limit=16, memory_mb=64, cpus=0.5, tmp_mb=8, workspace_mb=8, output_cap=100)
    assert s.container_config(cmd=["x"], labels={}, uid=200_000)["HostConfig"]["PidsLimit"] == 16


def test_settings_uid_pool_needs_a_leased_uid_and_a_fixed_user_needs_loosen():
    with pytest.raises(ValueError, match="leased uid"):
        SandboxSettings().container_config(cmd=["x"], labels={})
    with pytest.raises(ValueError, match="user"):
        SandboxSettings(user="1000:1000")  # one uid for every sandbox shares per-uid kernel limits
    for bad in [(0, 10), (1000, 2000), (300_000, 300_000), (300_000, 1 << 32)]:
        with pytest.raises(ValueError, match="uid_range"):
            SandboxSettings(uid_range=bad)
    fixed = SandboxSettings(user="1000:1000", loosen=frozenset({"user"})).container_config(
        cmd=["x"], labels={}
    )
    assert fixed["User"] == "1000:1000" and "uid=1000,gid=1000" in fixed["HostConfig"]["Tmpfs"]["/workspace"]


def test_settings_reject_unknown_loosen_and_non_positive_limits():
    with pytest.raises(ValueError, match="unknown"):
        SandboxSettings(loosen=frozenset({"memory_mb"}))
    assert set(SECURITY_FIELDS) >= {"network", "read_only_root", "user", "pids_limit"}
    for name in ("memory_mb", "pids_limit", "tmp_mb", "workspace_mb", "output_cap"):
        with pytest.raises(ValueError, match=name):
            SandboxSettings(**{name: 0})
    with pytest.raises(ValueError, match="lifetime_s"):
        SandboxSettings(lifetime_s=0)


# ---------------------------------------------------------------- engine errors


async def test_missing_image_raises_image_missing(docker_api):
    image = f"pqrl-no-such-image:{uuid.uuid4().hex[:12]}"
    with pytest.raises(ImageMissing, match=image):
        await DockerSandbox.create(docker_api, SandboxSettings(image=image), run=RUN_LABEL)
    assert not await leftover_containers(docker_api), "a failed create left a container"


async def test_unreachable_engine_raises_sandbox_unavailable(tmp_path):
    path = str(tmp_path / "no-docker.sock")
    api = DockerAPI(path)
    try:
        with pytest.raises(SandboxUnavailable, match=path):
            await DockerSandbox.create(api, run=RUN_LABEL)
        with pytest.raises(SandboxUnavailable, match=path):
            await api.ping()
    finally:
        await api.close()


# ---------------------------------------------------------------- container configuration


async def test_container_labels(make_sandbox, docker_api):
    session = uuid.uuid4().hex
    sb = await DockerSandbox.create(
        docker_api, SandboxSettings(memory_mb=128, lifetime_s=600), run=RUN_LABEL, session=session
    )
    try:
        labels = (await docker_api.inspect(sb.id))["Config"]["Labels"]
        assert labels["pqrl.run"] == RUN_LABEL and labels["pqrl.session"] == session, labels
        assert labels["pqrl.owner"] == owner_id(), labels
        assert abs(int(labels["pqrl.expires"]) - (time.time() + 600)) < 30, labels
        listed = await docker_api.list({"pqrl.session": session})
        assert [c["Id"] for c in listed] == [sb.id]
    finally:
        await sb.close()


async def test_container_host_config_is_hardened(make_sandbox, docker_api):
    sb = await make_sandbox(memory_mb=192, pids_limit=64, cpus=0.5, nofile=512, tmp_mb=32, workspace_mb=48)
    info = await docker_api.inspect(sb.id)
    host, config = info["HostConfig"], info["Config"]
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"], (host["CapDrop"], host["CapAdd"])
    assert host["ReadonlyRootfs"] is True
    assert host["Memory"] == host["MemorySwap"] == 192 << 20, (host["Memory"], host["MemorySwap"])
    assert host["PidsLimit"] == 64
    assert host["NanoCpus"] == 500_000_000
    assert "no-new-privileges" in host["SecurityOpt"], host["SecurityOpt"]
    assert host["Privileged"] is False and not host.get("Binds") and not host.get("Mounts")
    assert {"Name": "nofile", "Soft": 512, "Hard": 512} in host["Ulimits"]
    assert "size=32m" in host["Tmpfs"]["/tmp"] and "size=48m" in host["Tmpfs"]["/workspace"]
    assert config["User"] == f"{sb.uid}:{sb.uid}" and config["Labels"]["pqrl.uid"] == str(sb.uid)
    assert {"Name": "nproc", "Soft": 64, "Hard": 64} in host["Ulimits"]
    assert f"uid={sb.uid},gid={sb.uid}" in host["Tmpfs"]["/workspace"]
    assert host["Init"] is False and not config["Entrypoint"], "the exec agent must be pid 1"
    assert info["State"]["Running"] is True


# ---------------------------------------------------------------- lifecycle


async def test_close_removes_container_and_is_idempotent(docker_api):
    sb = await DockerSandbox.create(docker_api, SandboxSettings(memory_mb=128), run=RUN_LABEL)
    try:
        assert sb.alive and (await sb.exec("true")).ok
    finally:
        await sb.close()
    with pytest.raises(DockerError) as err:
        await docker_api.inspect(sb.id)
    assert err.value.status == 404
    assert sb.id not in [c["Id"] for c in await docker_api.list({"pqrl.run": RUN_LABEL})]
    await sb.close()  # a second close is a no-op
    assert not sb.alive
    with pytest.raises(SandboxError, match="closed"):
        await sb.exec("true")


async def test_close_fails_pending_execs(sandbox):
    """A call in flight when the sandbox is closed raises instead of hanging."""
    pending = asyncio.create_task(sandbox.exec("sleep 30", timeout=60))
    await asyncio.sleep(0.3)
    await sandbox.close()
    with pytest.raises(SandboxError):
        await asyncio.wait_for(pending, 5)


async def test_container_killed_from_outside(sandbox, docker_api):
    """An external kill fails the pending call and every later one with SandboxDied naming the cause."""
    pending = asyncio.create_task(sandbox.exec("sleep 30", timeout=60))
    await asyncio.sleep(0.3)
    await docker_api.kill(sandbox.id)
    with pytest.raises(SandboxDied, match="exit code 137"):
        await asyncio.wait_for(pending, 5)
    with pytest.raises(SandboxDied, match="container stopped") as err:
        await sandbox.exec("echo hi")
    assert err.value.exit_code == 137 and not err.value.oom_killed
    assert not sandbox.alive
    with pytest.raises(SandboxDied):
        await sandbox.read_file("/etc/hostname")


async def test_lifetime_expiry_kills_the_sandbox(make_sandbox):
    """After lifetime_s the container exits; calls then raise SandboxDied naming the lifetime."""
    t0 = time.monotonic()
    sb = await make_sandbox(lifetime_s=2)
    assert (await sb.exec("echo alive")).ok
    with pytest.raises(SandboxDied, match="lifetime of 2s expired") as err:
        await sb.exec("sleep 30", timeout=60)  # in flight when the lifetime runs out
    elapsed = time.monotonic() - t0
    assert 1.5 <= elapsed < 5.0, f"died after {elapsed:.2f}s, lifetime 2s"
    assert err.value.exit_code == 3
    with pytest.raises(SandboxDied, match="lifetime"):
        await sb.exec("echo again")


async def test_death_after_a_survived_oom_kill_names_the_real_cause(make_sandbox, docker_api):
    sb = await make_sandbox(memory_mb=128)
    bomb = await sb.exec(["python3", "-c", "a = []\nwhile True:\n    a.append(b'x' * (8 << 20))\n"])
    assert bomb.oom_killed and (await sb.exec("true")).ok, "precondition: a command OOM-killed, agent alive"
    await docker_api.kill(sb.id)
    with pytest.raises(SandboxDied, match="exit code 137") as err:
        await sb.exec("true")
    assert not err.value.oom_killed


async def test_scripts_in_workspace_and_tmp_are_executable(sandbox):
    for path in ("/workspace/run.sh", "/tmp/run.sh"):
        await sandbox.write_file(path, b"#!/bin/sh\necho ran\n", mode=0o755)
        r = await sandbox.exec([path])
        assert r.ok and r.stdout == b"ran\n", f"{path}: {r.text()}"
