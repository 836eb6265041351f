"""A private ``redis-server`` on a free loopback port, for the CLI's embedded mode, tests and benches.

Durability is a setting of the server, chosen here:

- ``appendfsync="everysec"`` (default): the append-only file is fsynced once a second, so a crash of
  the Redis process or the machine can lose up to about one second of acknowledged writes.
- ``appendfsync="always"``: every write is fsynced before Redis replies; a restart loses no
  acknowledged write, at a cost in write throughput.
- ``appendfsync="no"``: the OS decides when to flush (about 30 s on Linux); fastest, least safe.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

__all__ = ["RedisServer", "RedisServerError", "free_port", "stop_process"]

AppendFsync = Literal["always", "everysec", "no"]


class RedisServerError(RuntimeError):
    """``redis-server`` is missing or did not come up; the message carries its log tail."""


def die_with_parent() -> None:
    """``preexec_fn``: the child gets SIGTERM when the process that started it dies (Linux), so a
    job killed with SIGKILL leaves no server behind. Start such children from the main thread."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_process(proc: subprocess.Popen[Any], *, timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``; returns once it is reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """Runs ``redis-server`` as a child process with its data in ``data_dir``.

    Restarting with the same ``data_dir`` (and port) recovers the data from the append-only file.
    Use as a context manager, or call ``start()``/``stop()``.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        appendfsync: AppendFsync = "everysec",
        executable: str = "redis-server",
        die_with_parent: bool = False,
    ) -> None:
        self.port = port or free_port()
        self._own_dir = data_dir is None
        # absolute: redis-server changes into --dir before opening its log file
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="pqrl-redis-")).resolve()
        self.appendfsync = appendfsync
        self.executable = executable
        self.die_with_parent = die_with_parent  # a job's private server must not outlive a killed job
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def start(self, timeout: float = 20.0) -> RedisServer:
        exe = shutil.which(self.executable)
        if exe is None:
            raise RedisServerError(
                f"{self.executable!r} not found on PATH: run scripts/setup.sh "
                "(it installs Debian's redis-server)"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            exe,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.log_path),
        ]  # fmt: skip
        # its own log file; inheriting our stdout would keep a caller's pipe open after we die
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=die_with_parent if self.die_with_parent else None,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RedisServerError(f"redis-server exited with {self.proc.returncode}: {self._log_tail()}")
            if self._ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RedisServerError(f"redis-server did not answer PING within {timeout}s: {self._log_tail()}")

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to flush anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout_s=10)
        self.proc = None

    def close(self) -> None:
        """Stops the server and removes its data directory if this object created it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"
