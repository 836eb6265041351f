"""The processes an embedded job starts (Redis, engine, env server), watched: one that exits ends the
job within a second with one line naming it, its exit status and the last lines of its log; a wait
for a service to come up looks at its process at every poll and says what it waits for."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from pqrl.errors import PermanentFault, RetriesExhausted, UsageError
from pqrl.redis_server import stop_process

__all__ = ["ChildDied", "Children", "progress_every_s", "tail"]


POLL_S = 0.5
progress_every_s = 5.0  # how often a wait says it is still waiting


class ChildDied(SystemExit):
    """A child the job depends on died: ``code`` is the one line that says which and why, ``status``
    the job's exit status: the child's own when it names a class of ``pqrl.errors`` (2 bad input, 3
    permanent fault, 4 retries exhausted: an engine refusing an unknown model exits 3), else 1."""

    def __init__(self, line: str, child_status: int) -> None:
        super().__init__(line)
        classed = {c.exit_code for c in (UsageError, PermanentFault, RetriesExhausted)}
        self.status = child_status if child_status in classed else 1


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Children:
    """The job's child processes by name; ``quiet`` silences the progress of waits; ``command``
    begins every line."""

    quiet: bool = False
    command: str = "pqrl train"
    children: list[_Child] = field(default_factory=list)
    _deadline: threading.Timer | None = field(default=None, repr=False)

    def add(self, name: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.children.append(_Child(name, proc, log))

    def death(self) -> ChildDied | None:
        """What ends the job because the first child found dead died; None while all run."""
        for c in self.children:
            code = c.proc.poll()
            if code is not None:
                line = f"{self.command}: the {c.name} (pid {c.proc.pid}) {_status(code)}; {tail(c.log)}"
                return ChildDied(line, code)
        return None

    def exit_unless_done_in(self, seconds: float, line: str, status: int = 1) -> None:
        """Arms a hard end: unless ``disarm`` comes first, prints ``line``, stops the other children
        and exits the process with ``status`` after ``seconds``. The job's wind-down waits through
        Redis outages (groups are worth keeping across a restart) and cannot tell a dead Redis from
        a restarting one."""

        def end() -> None:
            for c in self.children:
                with contextlib.suppress(Exception):
                    stop_process(c.proc, timeout_s=5)
            print(line, file=sys.stderr, flush=True)  # last: the job's own errors may come before
            os._exit(status)

        self._deadline = threading.Timer(seconds, end)
        self._deadline.daemon = True
        self._deadline.start()

    def disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()

    async def wait_for_death(self) -> ChildDied:
        while (died := self.death()) is None:
            await asyncio.sleep(POLL_S)
        return died

    async def wait_until(
        self, ready: Callable[[], Awaitable[bool]], *, what: str, timeout_s: float, stop: asyncio.Event
    ) -> None:
        """Polls ``ready()`` until true; ends the job at once when a child dies or ``stop`` is set,
        and after ``timeout_s`` with the last lines of every child's log."""
        t0 = time.monotonic()
        told = t0
        while not await ready():
            if (died := self.death()) is not None:
                raise died
            waited = time.monotonic() - t0
            if stop.is_set():
                raise SystemExit(f"{self.command}: stopped while waiting for {what} ({waited:.0f} s)")
            if waited > timeout_s:
                logs = "".join(f"; {c.name}: {tail(c.log)}" for c in self.children)
                raise SystemExit(f"{self.command}: {what} not ready after {timeout_s:g} s{logs}")
            if not self.quiet and time.monotonic() - told >= progress_every_s:
                told = time.monotonic()
                print(f"{self.command}: waiting for {what}: {waited:.0f} s", file=sys.stderr, flush=True)
            await asyncio.sleep(POLL_S)


def _status(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


_RAISED = re.compile(r"^(\w+\.)*[A-Z]\w*: ")  # a traceback's last line: ``pkg.mod.SomeError: why``


def tail(path: Path, lines: int = 3) -> str:
    """What a log ends with, on one line: the exception a process died of when its log has one,
    else its last non-empty lines."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return f"no log at {path}"
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()]
    raised = [ln for ln in kept[-20:] if _RAISED.match(ln)]
    if raised:
        return f"{raised[-1]} (log: {path})"
    return f"last lines of {path}: " + (" | ".join(kept[-lines:]) if kept else "(empty)")
