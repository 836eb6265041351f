"""Real HTTP in tests: the project's in-thread server and free-port helpers, re-exported, the wait
for a server started as a separate process, and the engine and env server each in a process of its own."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from engine.thread_server import serve_in_thread
from pqrl.redis_server import free_port, stop_process
from sandboxes.docker import owner_id

if TYPE_CHECKING:
    from fastapi import FastAPI

    from env_server.app import ServerSettings
    from env_server.sessions import SessionManager

__all__ = [
    "LiveServer",
    "engine_process",
    "env_server_process",
    "free_port",
    "loopback_socket",
    "serve_in_thread",
    "wait_until_healthy",
]

ROOT = Path(__file__).resolve().parents[1]


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


@dataclass
class LiveServer:
    """A running env server: where it listens, its token, and (served in a thread of this process)
    its SessionManager; ``owner`` is the ``pqrl.owner`` label of the sandboxes that a server in its
    own process creates (this process's label for one in a thread)."""

    url: str
    token: str
    manager: SessionManager | None = None
    settings: ServerSettings | None = None
    app: FastAPI | None = None
    owner: str | None = None

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def healthz(self) -> dict[str, Any]:
        return httpx.get(self.url + "/healthz", timeout=5).json()


def loopback_socket() -> socket.socket:
    """A TCP socket bound to a free port on 127.0.0.1 (not listening yet): the server's own socket,
    so no other process can take the port between choosing and serving it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def env_server_process(token: str, **env: Any) -> Iterator[LiveServer]:
    """``python -m uvicorn --factory env_server.app:create_app`` in its own process, configured by
    ``PQRL_ENV_*`` variables (``sandbox_pool_size=2`` sets ``PQRL_ENV_SANDBOX_POOL_SIZE``; the pool
    size defaults to 0 here); stopped (SIGTERM, then SIGKILL) on exit."""
    sock = loopback_socket()
    host, port = sock.getsockname()
    environ = {**os.environ, "PQRL_ENV_TOKEN": token, "PQRL_ENV_SANDBOX_POOL_SIZE": "0"}
    environ.update({f"PQRL_ENV_{k.upper()}": str(v) for k, v in env.items()})
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "env_server.app:create_app", "--fd",
           str(sock.fileno()), "--log-level", "warning", "--no-access-log", "--backlog", "2048",
           "--http", "env_server.http_guard:GuardedH11Protocol"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=environ, pass_fds=(sock.fileno(),))
    url = f"http://{host}:{port}"
    try:
        owner = owner_id(proc.pid)  # read while the process runs: it names the process's start time
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"env server exited with {proc.returncode} during startup"
            assert time.monotonic() < deadline, "env server did not answer /healthz within 30 s"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.05)
        yield LiveServer(url, token, owner=owner)
    finally:
        stop_process(proc)
        sock.close()


async def stored_groups(redis_dir: Path, run: str) -> list[Any]:
    """The groups an embedded job left in its private Redis's data (``RUN_DIR/redis``), read with
    a Redis started on that folder and stopped again."""
    from pqrl.redis_server import RedisServer
    from pqrl.store import TrajectoryStore

    with RedisServer(data_dir=redis_dir) as server:
        async with TrajectoryStore(server.url, run) as store:
            return [group for _, group in await store.groups.peek(50)]
