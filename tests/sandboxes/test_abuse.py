"""The abuse battery: what model-written code may try, run in real containers.

Each test asserts the specific way the abuse is contained, and that the sandbox (and, where it
could matter, a bystander sandbox and the host) is fine afterwards. The attacks on the exec agent's
channel to the host are in test_abuse_channel.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

import pytest

from tests.sandboxes.probing import assert_only_the_agent, assert_responsive, processes, run_python

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- network


NETWORK_PROBE = r"""
import json, socket, time

def attempt(fn):
    t0 = time.monotonic()
    try:
        fn()
        return {"ok": True, "s": time.monotonic() - t0}
    except OSError as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "s": time.monotonic() - t0}

def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", ("8.8.8.8", 53))

print(json.dumps({
    "tcp 1.1.1.1:53": attempt(lambda: socket.create_connection(("1.1.1.1", 53), timeout=5).close()),
    "tcp 8.8.8.8:443": attempt(lambda: socket.create_connection(("8.8.8.8", 443), timeout=5).close()),
    "tcp6 [2606:4700:4700::1111]:443": attempt(
        lambda: socket.create_connection(("2606:4700:4700::1111", 443), timeout=5).close()),
    "udp 8.8.8.8:53": attempt(udp),
    "dns example.com": attempt(lambda: socket.getaddrinfo("example.com", 80)),
}))
"""


async def test_network_egress_fails_fast(sandbox):
    """No route out: TCP, UDP and DNS fail at once rather than after a connect timeout."""
    results = json.loads((await run_python(sandbox, NETWORK_PROBE)).stdout)
    for what, res in results.items():
        assert not res["ok"], f"{what} succeeded from inside the sandbox"
        assert res["s"] < 2.0, f"{what} took {res['s']:.2f}s to fail (should be immediate): {res}"
    assert "gaierror" in results["dns example.com"]["error"], results["dns example.com"]


async def test_only_loopback_interface_exists(sandbox):
    """/proc/net/dev lists the interfaces of the sandbox's network namespace: lo only."""
    dev = (await sandbox.read_file("/proc/net/dev")).decode()
    names = [line.split(":")[0].strip() for line in dev.splitlines()[2:] if ":" in line]
    assert names == ["lo"], f"interfaces in the sandbox: {names}"


# ---------------------------------------------------------------- processes


FORK_BOMB = r"""
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print(n, type(e).__name__, e.strerror)
"""


async def test_python_fork_bomb_hits_pids_limit(make_sandbox):
    """os.fork() in a loop stops at pids_limit with EAGAIN; its children die with the command."""
    sb = await make_sandbox(pids_limit=32)  # tightening needs no loosen
    r = await run_python(sb, FORK_BOMB, timeout=20)
    forked, error, *reason = r.stdout.decode().split()
    assert error == "BlockingIOError" and " ".join(reason) == "Resource temporarily unavailable", r
    assert 0 < int(forked) < 32, f"forked {forked} children under pids_limit=32"
    await assert_responsive(sb)
    await assert_only_the_agent(sb)


async def test_shell_fork_bomb_is_contained_and_neighbours_unaffected(make_sandbox):
    """The classic shell fork bomb fails to fork, is killed at the timeout, and a neighbour is fine."""
    sb, neighbour = await make_sandbox(pids_limit=32), await make_sandbox()
    # The parent shell then spins on builtins: a `sleep` there would itself fail to fork under the
    # limit and end the command early, and the test is about the timeout killing the whole group.
    bomb = asyncio.create_task(sb.exec("bomb() { bomb | bomb & }; bomb; while :; do :; done", timeout=2))
    await asyncio.sleep(1.0)  # the bomb is at the limit now
    await assert_responsive(neighbour, within=1.0)
    r = await bomb
    assert r.timed_out and r.exit_code == -9, f"bomb not killed at its timeout: {r}"
    assert b"Cannot fork" in r.stderr, f"pids limit never hit: {r.stderr[:300]!r}"
    await assert_responsive(sb)
    await assert_only_the_agent(sb)


async def test_infinite_loop_times_out_and_leaves_nothing(sandbox):
    """A busy loop is killed at its timeout, with its process group."""
    r = await sandbox.exec("while :; do :; done", timeout=2)
    assert r.timed_out and not r.ok, f"loop not reported as timed out: {r}"
    assert r.exit_code == -9, f"loop not SIGKILLed: exit {r.exit_code}"
    assert 2.0 <= r.duration < 3.5, f"duration {r.duration:.2f}s, timeout was 2s"
    await assert_only_the_agent(sandbox)


async def test_background_process_dies_when_command_returns(sandbox):
    """``sleep 1000 &`` shares the command's process group, which is killed when the command returns."""
    r = await sandbox.exec("sleep 1000 & echo started", timeout=5)
    assert r.ok and r.stdout == b"started\n", r
    assert r.duration < 2.0, f"the call waited for its background child: {r.duration:.2f}s"
    await assert_only_the_agent(sandbox)


async def test_setsid_background_process_dies_when_command_returns(sandbox):
    """A background process in a new session must not outlive its command either."""
    r = await sandbox.exec("setsid sleep 1000 & echo started", timeout=5)
    assert r.ok, r
    await assert_only_the_agent(sandbox)


# ---------------------------------------------------------------- memory


MEMORY_BOMB = "chunks = []\nwhile True:\n    chunks.append(b'x' * (8 << 20))\n"


async def test_memory_bomb_is_oom_killed_and_reported(make_sandbox):
    """Allocation past memory_mb is killed by the kernel; the result says so; the agent survives."""
    sb, neighbour = await make_sandbox(memory_mb=128), await make_sandbox()
    r = await sb.exec(["python3", "-c", MEMORY_BOMB], timeout=20)
    assert r.oom_killed, f"OOM kill not reported: {r}"
    assert r.exit_code == -9 and not r.timed_out, f"expected SIGKILL by the OOM killer: {r}"
    await assert_responsive(sb)
    ok = await sb.exec("echo fine")
    assert not ok.oom_killed, "oom_killed must describe only the command it ran under"
    await assert_responsive(neighbour)


# ---------------------------------------------------------------- disk


DISK_FILL = r"""
import json, os, sys
path, written, error = sys.argv[1], 0, None
chunk = b"x" * (1 << 20)
try:
    with open(path, "wb") as f:
        while written < (256 << 20):
            f.write(chunk)
            f.flush()
            written += len(chunk)
except OSError as e:
    error = e.strerror
st = os.statvfs(os.path.dirname(path))
print(json.dumps({"size": os.path.getsize(path), "error": error, "fs_bytes": st.f_blocks * st.f_frsize}))
"""


@pytest.mark.parametrize("where", ["/workspace", "/tmp"])
async def test_filling_the_disk_stops_at_the_tmpfs_cap(make_sandbox, where):
    """Writing 256 MB stops with ENOSPC at the 16 MB cap, in RAM-backed tmpfs, not on the host disk."""
    sb = await make_sandbox(memory_mb=128, tmp_mb=16, workspace_mb=16)
    host_free = shutil.disk_usage("/").free
    r = await run_python(sb, DISK_FILL, f"{where}/huge.bin")
    fill = json.loads(r.stdout)
    assert fill["error"] == "No space left on device", f"write in {where} did not hit ENOSPC: {fill}"
    assert fill["fs_bytes"] == 16 << 20, f"{where} is not a 16 MB filesystem: {fill}"
    assert (15 << 20) <= fill["size"] <= (16 << 20), f"file in {where} stopped at {fill['size']} bytes"
    drop = host_free - shutil.disk_usage("/").free
    assert drop < 64 << 20, f"host disk lost {drop >> 20} MB while the sandbox filled {where}"
    await assert_responsive(sb)
    # The sandbox can recover by deleting the file.
    assert (await sb.exec(f"rm {where}/huge.bin && echo x > {where}/small")).ok


# ---------------------------------------------------------------- output


def host_rss() -> int:
    """Resident set size of this test process in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_100mb_of_output_is_truncated_inside_the_sandbox(sandbox):
    """100 MB on each stream arrives as 64 KiB each, and the host process does not grow."""
    cap = sandbox.settings.output_cap
    assert cap == 64 << 10, "the default cap changed; update this test"
    before = host_rss()
    r = await sandbox.exec("head -c 100000000 /dev/zero; head -c 100000000 /dev/zero >&2", timeout=30)
    growth = host_rss() - before
    assert r.ok and r.truncated, f"expected a truncated, successful result: exit {r.exit_code}"
    assert len(r.stdout) == cap and len(r.stderr) == cap, (len(r.stdout), len(r.stderr))
    assert r.stdout == bytes(cap), "the kept part is not the start of the output"
    assert growth < 20 << 20, f"host process grew by {growth >> 20} MB for 200 MB of output"


async def test_output_under_the_cap_is_not_truncated(sandbox):
    """The flag marks real truncation only: exactly the cap is kept whole."""
    cap = sandbox.settings.output_cap
    r = await sandbox.exec(f"head -c {cap} /dev/zero")
    assert len(r.stdout) == cap and not r.truncated, r.truncated


# ---------------------------------------------------------------- filesystem


WRITE_PROBE = r"""
import json, sys
out = {}
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        out[path] = "written"
    except OSError as e:
        out[path] = e.strerror
print(json.dumps(out))
"""


async def test_writes_outside_workspace_and_tmp_fail(sandbox):
    """The root filesystem is read-only; only the tmpfs mounts take writes."""
    targets = ["/etc/x", "/usr/x", "/home/agent/x", "/x", "/usr/lib/python3/dist-packages/sitecustomize.py"]
    got = json.loads((await run_python(sandbox, WRITE_PROBE, *targets, "/workspace/x", "/tmp/x")).stdout)
    for path in targets:
        assert got[path] in ("Read-only file system", "Permission denied"), f"{path}: {got[path]}"
    assert got["/workspace/x"] == got["/tmp/x"] == "written", got


async def test_host_files_and_docker_socket_are_not_visible(sandbox):
    """Nothing of the host is mounted in: no Docker socket, no host /tmp, no checkout, own hostname."""
    marker = Path("/tmp") / f"pqrl-host-marker-{uuid.uuid4().hex}"
    marker.write_text("host secret")
    try:
        probe = (
            "import json, os, socket, sys\n"
            "print(json.dumps({p: os.path.exists(p) for p in sys.argv[1:]} | "
            "{'hostname': socket.gethostname()}))"
        )
        repo = str(Path(__file__).resolve().parents[2])  # this checkout, e.g. /work/main
        paths = ["/var/run/docker.sock", "/run/docker.sock", str(marker), repo, f"{repo}/pyproject.toml"]
        seen = json.loads((await run_python(sandbox, probe, *paths)).stdout)
    finally:
        marker.unlink()
    for path in paths:
        assert seen[path] is False, f"{path} is visible inside the sandbox"
    assert seen["hostname"] != socket.gethostname(), "the sandbox shares the host's hostname"


# ---------------------------------------------------------------- privileges


async def test_user_is_unprivileged(sandbox):
    """Its leased uid (never root) as uid and gid, every capability set empty, no_new_privs set."""
    uid = str(sandbox.uid)
    assert sandbox.uid >= 65536, sandbox.uid
    r = await sandbox.exec("id -u; id -g")
    assert r.stdout.split() == [uid.encode()] * 2, r
    status = dict(
        line.split(":\t", 1) for line in (await sandbox.read_file("/proc/self/status")).decode().splitlines()
    )
    assert status["Uid"].split() == [uid] * 4, status["Uid"]
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert status[cap] == "0000000000000000", f"{cap} = {status[cap]}"
    assert status["NoNewPrivs"] == "1", "no_new_privs not set"


SETUID_PROBE = r"""
import json, os, stat, subprocess, time
# A setuid-root binary that waits for input, so its credentials can be read while it runs.
su = "/usr/bin/su"
st = os.stat(su)
p = subprocess.Popen([su, "root", "-c", "id -u"], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
time.sleep(0.3)
with open(f"/proc/{p.pid}/status") as f:
    uid = next(line for line in f if line.startswith("Uid:")).split()[1:]
out, err = p.communicate(b"\n", timeout=15)
print(json.dumps({"setuid_root": bool(st.st_mode & stat.S_ISUID) and st.st_uid == 0,
                  "uid": uid, "rc": p.returncode, "out": out.decode(), "err": err.decode()}))
"""


async def test_setuid_binaries_do_not_escalate(sandbox):
    """no-new-privileges: a setuid-root binary runs with the sandbox's euid, and su cannot become root."""
    found = await sandbox.exec("find / -xdev -perm -4000 -type f 2>/dev/null", timeout=20)
    setuid = found.stdout.decode().split()
    assert "/usr/bin/su" in setuid, f"the image's setuid binaries changed: {setuid}; adapt this test"
    res = json.loads((await run_python(sandbox, SETUID_PROBE)).stdout)
    assert res["setuid_root"], "precondition: /usr/bin/su is setuid root"
    assert res["uid"] == [str(sandbox.uid)] * 4, (
        f"su ran with uids (real, effective, saved, fs) = {res['uid']}"
    )
    assert res["rc"] != 0 and res["out"].strip() != "0", f"su succeeded: {res}"


# ---------------------------------------------------------------- sandbox vs sandbox


async def test_sandboxes_cannot_see_each_others_files_or_processes(make_sandbox):
    """Separate tmpfs mounts, pid namespaces and hostnames."""
    a, b = await make_sandbox(), await make_sandbox()
    secret = uuid.uuid4().hex
    for path in ("/workspace/secret.txt", "/tmp/secret.txt"):
        await a.write_file(path, secret.encode())
        with pytest.raises(FileNotFoundError):
            await b.read_file(path)
    found = await b.exec(["grep", "-rl", secret, "/workspace", "/tmp"])
    assert found.stdout == b"", f"B found A's secret: {found.stdout!r}"

    marker = f"pqrl-marker-{uuid.uuid4().hex}"
    sleeper = asyncio.create_task(a.exec(["python3", "-c", "import time; time.sleep(30)", marker], timeout=2))
    try:
        deadline = time.monotonic() + 1.5
        while not any(marker in argv for argv in (await processes(a)).values()):
            assert time.monotonic() < deadline, "control failed: A's own probe never saw the marker"
        b_procs = await processes(b)
        assert not any(marker in argv for argv in b_procs.values()), f"B sees A's process: {b_procs}"
        assert list(b_procs) == [1], f"B sees more than its agent: {b_procs}"
    finally:
        r = await sleeper
    assert r.timed_out, r

    names = [(await sb.exec("hostname")).stdout for sb in (a, b)]
    assert names[0] != names[1], f"both sandboxes are named {names[0]!r}"


# ---------------------------------------------------------------- host disk via the engine


async def test_agent_traffic_is_not_logged_to_host_disk(sandbox, docker_api):
    """The agent's stdout is the reply channel; it must not accumulate in an unbounded host log."""
    for _ in range(10):
        await sandbox.exec("head -c 100000 /dev/zero", timeout=10)
    info = await docker_api.inspect(sandbox.id)
    log = info["HostConfig"]["LogConfig"]
    path = info.get("LogPath") or ""
    size = os.path.getsize(path) if os.access(path, os.R_OK) else -1  # readable when run as root
    assert log["Type"] == "none" or "max-size" in (log.get("Config") or {}), (
        f"unbounded container log {log} ({size} bytes after 10 commands at {path})"
    )
