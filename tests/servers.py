"""Real HTTP in tests: the project's in-thread server and free-port helpers, re-exported, and the
wait for a server started as a separate process."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from engine.serving import serve_in_thread
from pqrl.redis_server import free_port

__all__ = ["engine_process", "free_port", "serve_in_thread", "wait_until_healthy"]


def wait_until_healthy(
    url: str, proc: subprocess.Popen, output: Callable[[], str], timeout_s: float = 120.0
) -> None:
    """Polls ``GET url/health`` until it answers 200; fails with the process's output if it exits
    or never answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{url} did not become healthy:\n{output()[-3000:]}")
        time.sleep(0.2)


@contextlib.contextmanager
def engine_process(log_path: Path, *args: str) -> Iterator[str]:
    """``pqrl engine serve --backend builtin ARGS`` in its own process, on a free port; yields its URL."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "engine",
        "serve",
        "--backend",
        "builtin",
        "--port",
        str(port),
    ]
    with open(log_path, "w+") as log:
        proc = subprocess.Popen([*cmd, *args], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(url, proc, lambda: (log.seek(0), log.read())[1])
            yield url
        finally:
            proc.terminate()
            proc.wait(30)
