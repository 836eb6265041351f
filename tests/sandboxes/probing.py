"""Probes of a sandbox's insides for the abuse tests: which processes run, and whether the
sandbox still answers."""

from __future__ import annotations

import asyncio
import json
import time

from sandboxes.docker import DockerSandbox
from sandboxes.protocol import ExecResult

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
