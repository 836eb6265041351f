"""The servers behind an engine client: one HTTP connection pool, health checks and control calls.

A control call goes to one server or to all of them at once. Only a connection that could not be
established (nothing was sent) is tried again; once a request may have reached a server it is
never sent again, so an error there raises ``EngineRequestFailed`` / ``EngineHTTPError``.

Floor module: imports only the standard library, httpx and pydantic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Self

import httpx

from engine.errors import EngineHTTPError, EngineRequestFailed, EngineUnavailable

__all__ = ["Server", "ServerPool"]


class Server:
    """One server's address and what this client knows of it."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.in_flight = 0  # generations this client has in flight there
        self.last_pick = -1
        self.down_until = 0.0  # avoided until then (monotonic clock): it refused a connection
        self.known_version: int | None = None  # newest version this client saw from the server


class ServerPool:
    """Connections to one or more SGLang-API servers.

    Args:
        urls: server base URLs, e.g. ``"http://127.0.0.1:30000"``.
        api_key: sent as ``Authorization: Bearer`` when given.
        timeout_s: read timeout of a generation (None: wait as long as it takes).
        control_timeout_s: timeout of control calls (weight loading can take minutes).
        connect_timeout_s: TCP connect timeout.
        connect_retries: further attempts after a failed connection (nothing sent, so safe).
        retry_backoff_s: base of the exponential wait once every server refused.
        transport: an httpx transport (tests).
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        api_key: str | None = None,
        timeout_s: float | None = None,
        control_timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        connect_retries: int = 3,
        retry_backoff_s: float = 0.25,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError(f"{type(self).__name__} needs at least one server URL")
        self.servers = [Server(u) for u in urls]
        self.connect_retries = connect_retries
        self.retry_backoff_s = retry_backoff_s
        self._gen_timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s, pool=None)
        self._ctl_timeout = httpx.Timeout(control_timeout_s, connect=connect_timeout_s, pool=None)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Keep-alive shorter than servers' (uvicorn: 5 s), so a request is rarely sent on a connection
        # the server is closing: such a request could not be retried.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0)
        self._http = httpx.AsyncClient(headers=headers, limits=limits, transport=transport)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def health(self) -> dict[str, bool]:
        """Whether each server answers ``/health`` with 200."""

        async def one(s: Server) -> bool:
            try:
                r = await self._http.get(f"{s.url}/health", timeout=self._ctl_timeout)
            except httpx.HTTPError:
                return False
            return r.status_code == 200

        return dict(
            zip((s.url for s in self.servers), await asyncio.gather(*map(one, self.servers)), strict=True)
        )

    async def wait_until_healthy(self, timeout_s: float = 120.0, poll_s: float = 0.5) -> None:
        """Waits until every server is healthy; raises EngineUnavailable after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = await self.health()
            if all(status.values()):
                return
            if time.monotonic() > deadline:
                down = [u for u, ok in status.items() if not ok]
                raise EngineUnavailable(f"engines not healthy after {timeout_s:g} s: {down}")
            await asyncio.sleep(poll_s)

    async def _on_all(
        self, method: str, path: str, body: dict[str, Any] | None, *, raise_first: bool = False
    ) -> list[Any]:
        """The same control call on every server; each result is its answer or its exception."""
        results = await asyncio.gather(
            *(self._control(s, method, path, body) for s in self.servers), return_exceptions=True
        )
        if raise_first:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    async def _control(self, server: Server, method: str, path: str, body: dict[str, Any] | None) -> Any:
        """A control call on one server; only connection failures (nothing sent) are retried."""
        url = f"{server.url}{path}"
        for attempt in range(self.connect_retries + 1):
            try:
                r = await self._http.request(method, url, json=body, timeout=self._ctl_timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                if attempt == self.connect_retries:
                    raise EngineUnavailable(f"{url}: {e}") from e
                await asyncio.sleep(self.retry_backoff_s * 2**attempt)
                continue
            except httpx.TransportError as e:
                raise EngineRequestFailed(f"{url}: {type(e).__name__}: {e}; not retried") from e
            if r.status_code >= 400:
                try:
                    payload = r.json()
                except ValueError:
                    payload = None
                if isinstance(payload, dict) and "success" in payload:
                    return payload  # SGLang reports a failed update as 400 + {"success": false, ...}
                raise EngineHTTPError(url, r.status_code, r.text)
            if r.headers.get("content-type", "").startswith("application/json"):
                return r.json()
            return {"message": r.text}  # SGLang answers some control calls in plain text
        raise AssertionError("unreachable")
