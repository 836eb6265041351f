"""A job's private Redis must not outlive the job: with ``die_with_parent`` a SIGKILLed owner
takes its server with it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

OWNER = """
import os, sys
from pqrl.redis_server import RedisServer
server = RedisServer(die_with_parent=sys.argv[1] == "1").start()
print(server.port, flush=True)
os.kill(os.getpid(), 9)
"""


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _orphan_port(die_with_parent: bool) -> int:
    out = subprocess.run([sys.executable, "-c", OWNER, "1" if die_with_parent else "0"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    return int(out.stdout.split()[0])


def test_a_private_server_dies_with_its_killed_owner_only_when_asked():
    kept = _orphan_port(False)
    try:
        assert _answers(kept), "without the option the server survives (what the job must not do)"
    finally:
        subprocess.run(["redis-cli", "-p", str(kept), "shutdown", "nosave"], capture_output=True)
    port = _orphan_port(True)
    deadline = time.monotonic() + 10
    while _answers(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _answers(port)
