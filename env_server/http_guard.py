"""How the env server is served: uvicorn's h11 protocol with a bounded request read and a bounded
number of connections.

uvicorn times out only idle keep-alive connections: a client that sends half a header, or half a
body, holds its connection (and the request's task) for as long as it likes, and nothing bounds
how many connections are open. The protocol here closes a connection whose request (request line,
headers and body) has not fully arrived ``read_timeout_s`` after the connection opened or after
the request's first byte, and answers 503 to, then closes, a connection beyond
``max_connections``. ASGI middleware cannot do this: the app is called only once the headers are in.

``pqrl env-server`` uses it (``uvicorn_options``); with the uvicorn command line, pass
``--http env_server.http_guard:GuardedH11Protocol`` (the settings' defaults, or ``PQRL_ENV_*``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from env_server.app import ServerSettings

__all__ = ["GuardedH11Protocol", "guarded_protocol", "uvicorn_options"]

_BUSY_BODY = b'{"error":"too_many_connections","detail":"the server has its limit of connections open"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"retry-after: 1\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)

_FROM_ENV = ServerSettings()  # what the class itself applies: the defaults, or PQRL_ENV_* variables


class GuardedH11Protocol(H11Protocol):
    """H11Protocol with a deadline on reading each request and a cap on open connections."""

    read_timeout_s: float = _FROM_ENV.request_read_timeout_s
    max_connections: int = _FROM_ENV.max_connections

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._read_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)  # type: ignore[arg-type]
        if len(self.connections) > self.max_connections:
            self.transport.write(_BUSY)
            self.transport.close()
            return
        self._arm()  # the first request must arrive in time, even if not a byte of it does

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        # A request is being read while its headers or body are incomplete; an idle keep-alive
        # connection (nothing buffered) is left to uvicorn's keep-alive timeout.
        state = self.conn.their_state
        if state is h11.SEND_BODY or (state is h11.IDLE and self.conn.trailing_data[0]):
            self._arm()
        else:
            self._disarm()

    def _arm(self) -> None:
        if self._read_timer is None:
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if not self.transport.is_closing():
            self.logger.warning(
                "closing a connection whose request did not arrive in %gs", self.read_timeout_s
            )
            self.transport.close()


def guarded_protocol(settings: ServerSettings) -> type[GuardedH11Protocol]:
    """The protocol class with ``settings``' read timeout and connection cap."""
    attrs = {"read_timeout_s": settings.request_read_timeout_s, "max_connections": settings.max_connections}
    return type("GuardedH11Protocol", (GuardedH11Protocol,), attrs)


def uvicorn_options(settings: ServerSettings) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` or ``uvicorn.Config`` that apply ``settings``' bounds."""
    return {"http": guarded_protocol(settings), "timeout_keep_alive": settings.keep_alive_s}
