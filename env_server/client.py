"""Clients with one interface, so rollout code does not care where environments live.

``LocalEnvClient`` runs sessions in this process (no HTTP); ``HttpEnvClient`` talks to one or more
env servers. Both raise the same typed errors (env_server.sessions). With several servers, a new
session goes to the server with the fewest sessions this client opened there, and every later call
of that session goes to the server that created it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from env_server.sessions import (
    BackendDown,
    BadTask,
    EnvironmentBroken,
    EnvServerError,
    GraderFailure,
    InfraFailure,
    InvalidRequest,
    NotFound,
    RequestConflict,
    SessionDone,
    SessionManager,
    TooManySessions,
    UnknownEnv,
)
from env_server.types import RewardResult, SessionInfo, StepResult, ToolCall, ToolCallRequest
from pqrl.finite import bounded, loads_finite

__all__ = ["AuthError", "EnvClient", "EnvUnavailable", "HttpEnvClient", "InvalidReply", "LocalEnvClient"]

log = logging.getLogger(__name__)
Model = TypeVar("Model", bound=BaseModel)


class AuthError(EnvServerError):
    status, code = 401, "unauthorized"


class EnvUnavailable(EnvServerError):
    """No env server answered (after retries)."""

    status, code = 503, "unavailable"


class InvalidReply(EnvServerError):
    """The server's reply is not what the route answers: not JSON, a number that is not finite (a
    NaN reward would train on garbage), or not the route's record. The server's fault, not
    retried: the same request would get the same reply."""

    status, code = 502, "invalid_reply"


class EnvClient(Protocol):
    async def environments(self) -> list[dict[str, Any]]: ...

    async def create_session(
        self,
        env_id: str,
        task: dict[str, Any],
        seed: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> SessionInfo: ...

    async def step(
        self, session_id: str, tool_calls: list[ToolCall], request_id: str | None = None
    ) -> StepResult: ...

    async def evaluate(self, session_id: str) -> RewardResult: ...

    async def close_session(self, session_id: str) -> None: ...

    async def aclose(self) -> None: ...


class LocalEnvClient:
    """Sessions in this process, through the same SessionManager the server uses."""

    def __init__(self, manager: SessionManager | None = None) -> None:
        self.manager = manager or SessionManager()

    async def environments(self) -> list[dict[str, Any]]:
        return self.manager.environments()

    async def create_session(
        self,
        env_id: str,
        task: dict[str, Any],
        seed: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> SessionInfo:
        return await self.manager.create(env_id, task, seed, env_kwargs)

    async def step(
        self, session_id: str, tool_calls: list[ToolCall], request_id: str | None = None
    ) -> StepResult:
        # through the wire model, so a call is held to the same limits as over HTTP
        calls = [ToolCallRequest.of(c).to_call() for c in tool_calls]
        return await self.manager.step(session_id, calls, request_id)

    async def evaluate(self, session_id: str) -> RewardResult:
        return await self.manager.evaluate(session_id)

    async def close_session(self, session_id: str) -> None:
        await self.manager.close(session_id)

    async def aclose(self) -> None:
        await self.manager.shutdown()


_ERRORS: dict[str, type[EnvServerError]] = {
    cls.code: cls
    for cls in (
        NotFound,
        SessionDone,
        RequestConflict,
        InvalidRequest,
        TooManySessions,
        InfraFailure,
        GraderFailure,
        EnvironmentBroken,
        AuthError,
        UnknownEnv,
        BadTask,
        BackendDown,
    )
}


class HttpEnvClient:
    """Async HTTP client for one or more env servers, with pooling, retries and stickiness.

    Args:
        urls: base URLs of env servers (``http://host:port``).
        token: the servers' bearer token.
        retries: extra attempts on connection errors and 5xx (not on 502, a dead sandbox, nor on a
            5xx that names a known error, such as a grader that raised: the server's answer).
        backoff_s: first retry delay; doubles each time.
    """

    def __init__(
        self,
        urls: str | list[str],
        *,
        token: str | None = None,
        retries: int = 3,
        backoff_s: float = 0.2,
        timeout_s: float = 300.0,
        max_connections: int = 256,
    ) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError("at least one env server URL is needed")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # Keep-alive shorter than the server's (uvicorn: 5 s), so a request is rarely sent on a
        # connection the server is closing.
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections, keepalive_expiry=2.0
        )
        self._http = httpx.AsyncClient(headers=headers, timeout=timeout_s, limits=limits)
        self.retries, self.backoff_s = retries, backoff_s
        self._home: dict[str, str] = {}  # session id -> server url
        self._open = dict.fromkeys(self.urls, 0)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def environments(self) -> list[dict[str, Any]]:
        return await self._call("GET", self.urls[0], "/environments")

    async def not_ready(self) -> dict[str, str]:
        """The servers whose ``/readyz`` does not answer 200, with the cause (empty: all ready)."""
        out = {}
        for url in self.urls:
            try:
                r = await self._http.get(url + "/readyz", timeout=10)
            except httpx.TransportError as e:
                out[url] = f"unreachable: {e!r}"
                continue
            if r.status_code != 200:
                out[url] = f"HTTP {r.status_code}: {_body(r)[1]}"
        return out

    async def create_session(
        self,
        env_id: str,
        task: dict[str, Any],
        seed: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> SessionInfo:
        url = min(self.urls, key=lambda u: self._open[u])
        # The request id makes a retried create (lost reply) return the same session.
        body = {"env_id": env_id, "task": task, "seed": seed, "env_kwargs": env_kwargs or {},
                "request_id": uuid.uuid4().hex}  # fmt: skip
        data = await self._call("POST", url, "/sessions", json=body)
        info = _reply(SessionInfo, data, url)
        self._home[info.session_id] = url
        self._open[url] += 1
        return info

    async def step(
        self, session_id: str, tool_calls: list[ToolCall], request_id: str | None = None
    ) -> StepResult:
        body = {
            "tool_calls": [ToolCallRequest.of(c).model_dump() for c in tool_calls],
            "request_id": request_id or uuid.uuid4().hex,  # the same id on every retry: applied once
        }
        data = await self._call("POST", self._url(session_id), f"/sessions/{session_id}/step", json=body)
        return _reply(StepResult, data, self._url(session_id))

    async def evaluate(self, session_id: str) -> RewardResult:
        data = await self._call("POST", self._url(session_id), f"/sessions/{session_id}/evaluate")
        return _reply(RewardResult, data, self._url(session_id))

    async def close_session(self, session_id: str) -> None:
        url = self._url(session_id)
        try:
            await self._call("DELETE", url, f"/sessions/{session_id}")
        except EnvUnavailable:
            raise  # the session may still be open there: keep it on the books for another try
        except NotFound:
            pass  # already gone (expired or closed): forget it below
        self._home.pop(session_id, None)
        self._open[url] -= 1

    def _url(self, session_id: str) -> str:
        try:
            return self._home[session_id]
        except KeyError:
            raise NotFound(f"session {session_id} was not created by this client") from None

    async def _call(self, method: str, url: str, path: str, *, json: Any = None, retry: bool = True) -> Any:
        delay = self.backoff_s
        attempts = 1 + (self.retries if retry else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                r = await self._http.request(method, url + path, json=json)
            except httpx.TransportError as e:
                if last:
                    raise EnvUnavailable(f"env server {url} unreachable: {e!r}") from e
            else:
                if r.status_code < 400:
                    return _json(url, method, path, r)
                if r.status_code < 500 or r.status_code == 502 or last or _body(r)[0] in _ERRORS:
                    raise _error(url, r)
            log.info("env server %s %s %s failed; retrying in %.2fs", url, method, path, delay)
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


def _json(url: str, method: str, path: str, r: httpx.Response) -> Any:
    """A success's body; NaN, Infinity and 1e999 refused (``json`` would read them as floats)."""
    if not r.content:
        return None
    try:
        return loads_finite(r.content)
    except ValueError as e:  # JSONDecodeError included
        raise InvalidReply(f"{url}: {method} {path} replied {str(e)[:200]}") from None


def _reply(model: type[Model], data: Any, url: str) -> Model:
    """``data`` as the route's record, or InvalidReply saying why (a NaN reward, a missing field)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise InvalidReply(f"{url}: the reply is not a {model.__name__}: {str(e)[:500]}") from None


def _body(r: httpx.Response) -> tuple[str, str]:
    """(error code, detail) of an error response; no code when it is not the server's ErrorBody."""
    try:
        body = r.json()
        return str(body.get("error", "")), str(body.get("detail", r.text))
    except (ValueError, AttributeError):
        return "", r.text


def _error(url: str, r: httpx.Response) -> EnvServerError:
    code, detail = _body(r)
    if r.status_code == 429:
        return TooManySessions(f"{url}: {detail}", _retry_after(r.headers.get("Retry-After", "1")))
    err: EnvServerError
    if r.status_code in (401, 403):
        err = AuthError(f"{url}: {r.status_code} {detail}")
    elif (cls := _ERRORS.get(code)) is not None:
        return cls(f"{url}: {detail}")
    else:
        err = EnvServerError(f"{url}: HTTP {r.status_code}: {detail}")
    err.status = r.status_code
    return err


def _retry_after(header: str) -> float:
    """The server's Retry-After in seconds, within an hour; 1 s when it is not a finite number."""
    try:
        return bounded(header, 0.0, 3600.0, "Retry-After")
    except ValueError:
        return 1.0
