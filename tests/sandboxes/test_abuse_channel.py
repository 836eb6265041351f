"""The abuse battery, on the exec agent's channel to the host: commands that try to reach,
forge or end the agent that carries their replies, run in real containers (the other attacks are in
test_abuse.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess

import pytest

from sandboxes.docker import DockerSandbox, _unsafe_agent
from sandboxes.image import build_image_from_dockerfile
from sandboxes.protocol import SandboxError
from tests.sandboxes.agents import dumpable_agent_source
from tests.sandboxes.conftest import BASE_SETTINGS, RUN_LABEL, leftover_containers
from tests.sandboxes.probing import assert_only_the_agent, assert_responsive, run_python

pytestmark = pytest.mark.timeout(60)


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
