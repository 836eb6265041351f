"""Serving an ASGI app on a port the command binds itself, before any slow start-up.

A port already taken is then the command's own one-line error (``UsageError``), found before the
model or index loads, instead of uvicorn's log line minutes later; uvicorn gets the bound socket.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from pqrl.errors import UsageError

__all__ = ["listening_socket", "serve"]


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` and listening; ``UsageError`` when it cannot be.

    Listening at once holds the port: a bound socket that does not listen yet can be bound again by
    another ``SO_REUSEADDR`` socket. Connections made during a slow start wait in the backlog.
    """
    if not 0 <= port <= 65535:  # the socket layer would take it modulo 65536
        raise UsageError(f"--port {port} is not a port (0 to 65535)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: {e.strerror}", fix="give an address of this machine") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise UsageError(
                f"port {port} on {host} is in use", fix="give another --port, or stop what listens there"
            ) from None
        why = f"cannot listen on {host}:{port}: {e.strerror}"
        raise UsageError(why, fix="check --host and --port") from None
    sock.listen(128)
    return sock


def serve(app: Any, sock: socket.socket, **config: Any) -> None:
    """Runs ``app`` with uvicorn on ``sock`` (from ``listening_socket``) until stopped."""
    import uvicorn

    host, port = sock.getsockname()[:2]
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, **config)).run(sockets=[sock])
