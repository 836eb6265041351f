"""The abuse battery: what model-written code may try, run in real containers.

Each test asserts the specific way the abuse is contained, and that the sandbox (and, where it
could matter, a bystander sandbox and the host) is fine afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from sandboxes.docker import DockerSandbox, _unsafe_agent
from sandboxes.image import build_image_from_dockerfile
from sandboxes.protocol import ExecResult, SandboxError
from tests.sandboxes.agents import dumpable_agent_source
from tests.sandboxes.conftest import BASE_SETTINGS, RUN_LABEL, leftover_containers

pytestmark = pytest.mark.timeout(60)

# Lists every process but the probe itself as "pid argv0 argv1 ..." (the image has no ps).
PROCESS_PROBE = r"""
import json, os
me, procs = os.getpid(), {}
for d in os.listdir("/proc"):
    if d.isdigit() and int(d) != me:
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue  # exited while we looked
        procs[d] = [a.decode(errors="replace")[:80] for a in argv[:4]]
print(json.dumps(procs))
"""


async def run_python(sb: DockerSandbox, source: str, *args: str, timeout: float = 30.0) -> ExecResult:
    """Runs a Python snippet as argv (no shell in between) and insists that it succeeded."""
    r = await sb.exec(["python3", "-c", source, *args], timeout=timeout)
    assert r.ok, f"probe failed: exit {r.exit_code}, timed_out={r.timed_out}: {r.text()}"
    return r


async def processes(sb: DockerSandbox) -> dict[int, list[str]]:
    """pid -> first argv entries of every process in the sandbox except the probe."""
    r = await run_python(sb, PROCESS_PROBE)
    return {int(pid): argv for pid, argv in json.loads(r.stdout).items()}


def is_agent(argv: list[str]) -> bool:
    return argv[:3] == ["python3", "-u", "-c"]


async def assert_only_the_agent(sb: DockerSandbox) -> None:
    """Nothing but the exec agent (pid 1) is running, not even a zombie; polls briefly for reaping."""
    deadline = time.monotonic() + 2.0
    while True:
        procs = await processes(sb)
        extra = {p: a for p, a in procs.items() if p != 1}
        if not extra or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert is_agent(procs.get(1, [])), f"pid 1 is not the exec agent: {procs}"
    assert not extra, f"processes outlived their command (an empty argv is a zombie): {extra}"


async def assert_responsive(sb: DockerSandbox, within: float = 2.0) -> None:
    """The sandbox still runs a trivial command promptly."""
    t0 = time.monotonic()
    r = await sb.exec("echo ok", timeout=within)
    elapsed = time.monotonic() - t0
    assert r.ok and r.stdout == b"ok\n", f"sandbox broken after abuse: {r}"
    assert elapsed < within, f"echo took {elapsed:.2f}s"


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
    """uid/gid 1000 with every capability set empty and no_new_privs set."""
    r = await sandbox.exec("id -u; id -g")
    assert r.stdout.split() == [b"1000", b"1000"], r
    status = dict(
        line.split(":\t", 1) for line in (await sandbox.read_file("/proc/self/status")).decode().splitlines()
    )
    assert status["Uid"].split() == ["1000"] * 4, status["Uid"]
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
    """no-new-privileges: a setuid-root binary runs with euid 1000, and su cannot become root."""
    found = await sandbox.exec("find / -xdev -perm -4000 -type f 2>/dev/null", timeout=20)
    setuid = found.stdout.decode().split()
    assert "/usr/bin/su" in setuid, f"the image's setuid binaries changed: {setuid}; adapt this test"
    res = json.loads((await run_python(sandbox, SETUID_PROBE)).stdout)
    assert res["setuid_root"], "precondition: /usr/bin/su is setuid root"
    assert res["uid"] == ["1000"] * 4, f"su ran with uids (real, effective, saved, fs) = {res['uid']}"
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


# ---------------------------------------------------------------- the host channel


async def test_commands_cannot_reach_the_agents_stdout(sandbox):
    """Through /proc/<agent>/fd/1 a command could forge replies to the host: the agent is not dumpable."""
    script = (  # run as an argv command, so its parent is the agent
        "import os\n"
        "p = os.getppid()\n"
        "try:\n"
        "    os.listdir(f'/proc/{p}/fd'); print('open', p)\n"
        "except PermissionError:\n"
        "    print('denied', p)\n"
    )
    r = await sandbox.exec(["python3", "-c", script])
    assert r.ok, r
    assert r.stdout == b"denied 1\n", r.stdout


# For `seconds`, writes forged replies to the requests first..last-1 into every fd under /proc it
# can find (and into /proc/1/fd/0-15 unlisted); prints path -> "written" or the error it met.
FORGER = r"""
import base64, json, os, sys, time

first, last, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
reply = {"ok": True, "stdout": base64.b64encode(b"FORGED\n").decode(), "stderr": "", "exit_code": 0,
         "timed_out": False, "truncated": False, "duration": 0.0, "oom_killed": False}
lines = b"".join(json.dumps({"id": i, **reply}).encode() + b"\n" for i in range(first, last))
me, met = os.getpid(), {}

def listing(d):
    try:
        return os.listdir(d)
    except OSError as e:
        met[d] = type(e).__name__
        return []

def targets():
    yield from (f"/proc/1/fd/{n}" for n in range(16))
    for pid in listing("/proc"):
        if pid.isdigit() and int(pid) != me:
            for d in [f"/proc/{pid}/fd"] + [f"/proc/{pid}/task/{t}/fd" for t in listing(f"/proc/{pid}/task")]:
                yield from (f"{d}/{n}" for n in listing(d))

deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    for path in targets():
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            met[path] = type(e).__name__
            continue
        try:
            os.write(fd, lines)
            met[path] = "written"
        except OSError as e:
            met[path] = "opened, then " + type(e).__name__
        finally:
            os.close(fd)
    time.sleep(0.05)
print(json.dumps(met))
"""


async def test_commands_cannot_forge_the_agents_replies(sandbox):
    """The agent, pid 1 and undumpable, is the only process holding the host channel: a command that
    tries every fd it can find under /proc meets only refusals, and no later call is answered by
    one of its replies (ids 0-999 cover every call this sandbox gets)."""
    r = await run_python(sandbox, FORGER, "0", "1000", "1.0")
    met = json.loads(r.stdout)  # a reply to the forger itself would not parse
    assert met["/proc/1/fd/0"] == met["/proc/1/fd/1"] == met["/proc/1/fd"] == "PermissionError", met
    assert any(p.startswith("/proc/1/task/") for p in met), f"the agent's threads were not tried: {met}"
    opened = {p: m for p, m in met.items() if m not in ("PermissionError", "FileNotFoundError")}
    assert not opened, f"a command opened these: {opened}"
    replies = [await sandbox.exec("echo real") for _ in range(50)]
    forged = [r for r in replies if not (r.ok and r.stdout == b"real\n")]
    assert not forged, f"{len(forged)} of 50 replies forged, e.g. {forged[0]}"


async def test_no_process_but_the_agent_holds_the_channel(sandbox, docker_api):
    """Seen from the host, the pipes on the agent's fds 0-2 are open in no other process of the
    sandbox, while a command, its children and an escaped daemon run."""
    if os.geteuid() != 0:
        pytest.skip("reading other processes' fds from the host needs root")
    busy = asyncio.create_task(
        sandbox.exec("sleep 3 & setsid sleep 3 & python3 -c 'import time; time.sleep(3)' | cat", timeout=10)
    )
    await asyncio.sleep(0.5)
    agent = (await docker_api.inspect(sandbox.id))["State"]["Pid"]
    namespace = os.readlink(f"/proc/{agent}/ns/pid")
    channel = {os.readlink(f"/proc/{agent}/fd/{fd}") for fd in (0, 1, 2)}
    others = [p for p in host_processes() if p != agent and pid_namespace(p) == namespace]
    assert len(others) >= 4, f"control: the command's processes were not found: {others}"
    held = {p: fds for p in others if (fds := open_files(p) & channel)}
    assert not held, f"processes other than the agent hold the channel {channel}: {held}"
    assert (await busy).ok


def host_processes() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def open_files(pid: int) -> set[str]:
    """What the fds of a host process point to (pipe:[inode], paths), as far as it still runs."""
    found = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return found


async def test_no_signal_from_inside_ends_the_agent(sandbox):
    """As pid 1 the agent only gets the signals it handles, and it handles none: every signal sent
    to it from inside is dropped; kill -9 -1 kills the other commands, not the agent."""
    status = (await sandbox.exec("cat /proc/1/status")).stdout.decode()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    assert caught & 0x7FFFFFFF == 0, f"the agent handles standard signals (SigCgt {caught:#x})"
    sleeper = asyncio.create_task(sandbox.exec("sleep 30", timeout=60))
    await asyncio.sleep(0.3)
    await run_python(sandbox, "import os\nfor s in range(1, 65):\n    os.kill(1, s)\n")
    r = await sandbox.exec("kill -INT 1 && kill -TERM 1 && kill -KILL 1 && kill -9 -1 && echo survived")
    assert r.stdout == b"survived\n", r
    assert (await asyncio.wait_for(sleeper, 5)).exit_code == -9, "kill -9 -1 spared the other command"
    await assert_responsive(sandbox)
    await assert_only_the_agent(sandbox)


async def test_orphans_are_reaped_so_zombies_never_fill_the_pids_limit(make_sandbox):
    """Killed background processes whose parent exited are the agent's children, as pid 1; it reaps
    them. 40 commands leave 160 of them, 5 times the pids limit, and every command still forks."""
    sb = await make_sandbox(pids_limit=32)
    orphans = "sh -c 'sleep 100 & sleep 100 &'; sh -c 'sleep 100 &'; setsid sleep 100 & echo ok"
    for _ in range(40):
        r = await sb.exec(orphans, timeout=10)
        assert r.ok and r.stdout == b"ok\n", f"fork failed: zombies piled up? {r}"
    await assert_only_the_agent(sb)


async def test_an_agent_that_stays_dumpable_is_refused(docker_api, monkeypatch):
    """Fail closed: a sandbox whose agent could not make itself undumpable is removed, not used."""
    monkeypatch.setattr("sandboxes.docker.AGENT_SOURCE", dumpable_agent_source())
    with pytest.raises(SandboxError, match="could not make itself undumpable"):
        await DockerSandbox.create(docker_api, BASE_SETTINGS, run=RUN_LABEL)
    assert await leftover_containers(docker_api) == [], "the refused sandbox was not removed"


def test_an_agent_that_is_not_pid_1_is_refused():
    assert _unsafe_agent({"ready": True, "pid": 1, "undumpable": True}) is None
    assert "pid 7, not 1" in _unsafe_agent({"ready": True, "pid": 7, "undumpable": True})
    assert "undumpable" in _unsafe_agent({"ready": True, "pid": 1})


async def test_an_image_entrypoint_does_not_displace_the_agent_as_pid_1(make_sandbox, tmp_path):
    """An entrypoint would be pid 1 and hold the channel, with the agent its child: it is not run."""
    (tmp_path / "Dockerfile").write_text(
        f'FROM {BASE_SETTINGS.image}\nENTRYPOINT ["/bin/sh", "-c", "\\"$@\\"; exit $?", "sh"]\n'
    )
    tag = build_image_from_dockerfile(tmp_path / "Dockerfile", name="pqrl-test-entrypoint", progress=print)
    try:
        sb = await make_sandbox(image=tag)
        await assert_only_the_agent(sb)
    finally:
        subprocess.run(["docker", "rmi", "-f", tag, "pqrl-test-entrypoint:latest"], capture_output=True)


@pytest.mark.parametrize("target", ["/dev/stdout", "/dev/stdin", "/proc/1/fd/1", "/dev/zero", "fifo"])
async def test_file_calls_refuse_links_to_the_channel_devices_and_fifos(sandbox, target):
    """read_file/write_file through a planted link or FIFO: refused at once, nothing reaches the
    host channel (the agent's own stdin/stdout), and the sandbox keeps answering."""
    if target == "fifo":
        assert (await sandbox.exec("mkfifo /workspace/x")).ok
    else:
        assert (await sandbox.exec(f"ln -s {target} /workspace/x")).ok
    forged = b'{"id": 0, "ok": true, "stdout": "Rk9SR0VE"}\n' * 100
    with pytest.raises(ValueError, match="not a regular file"):
        await asyncio.wait_for(sandbox.write_file("/workspace/x", forged), 5)
    with pytest.raises(ValueError, match="not a regular file"):
        await asyncio.wait_for(sandbox.read_file("/workspace/x"), 5)
    for _ in range(5):
        r = await sandbox.exec("echo real")
        assert r.stdout == b"real\n", r
