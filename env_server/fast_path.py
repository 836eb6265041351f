"""The session routes answered directly, without FastAPI's per-request machinery.

Under load the framework, not the environments, was the server's cost: routing, dependency
solving, the Request object and the exception middleware took about two thirds of the CPU of a
no-op step. ``SessionRoutes`` sits inside the token gate, the body limit and the 500 guard
(env_server.app) and answers the four session routes when the request is well formed: a JSON
content type, a body that parses and validates as the route's model. Anything else (a body that
does not validate, another content type, a method or path it does not know) goes on, with the
body replayed, to the FastAPI routes, which then answer exactly as they always have (422 with the
same detail, 404, 405, the OpenAPI spec): the error schema has one source. Session errors are
answered with the same body the app's handler gives (``env_error_reply``).
"""

from __future__ import annotations

import email.message
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from env_server.sessions import EnvServerError, SessionManager
from env_server.types import RewardResult, SessionInfo, StepResult
from env_server.wire import CreateSession, StepRequest, env_error_reply

__all__ = ["SessionRoutes", "is_session_route"]

_Handler = Callable[[SessionManager, str, Any], Awaitable[tuple[int, bytes]]]


# Serialised as the route's declared type, as FastAPI does: an environment's subclass of a reply
# record cannot add fields to what the client receives.
_INFO, _RESULT, _REWARD = TypeAdapter(SessionInfo), TypeAdapter(StepResult), TypeAdapter(RewardResult)


async def _create(sessions: SessionManager, _: str, body: CreateSession) -> tuple[int, bytes]:
    info = await sessions.create(body.env_id, body.task, body.seed, body.env_kwargs, body.request_id)
    return 201, _INFO.dump_json(info, by_alias=True)


async def _step(sessions: SessionManager, session_id: str, body: StepRequest) -> tuple[int, bytes]:
    result = await sessions.step(session_id, [c.to_call() for c in body.tool_calls], body.request_id)
    return 200, _RESULT.dump_json(result, by_alias=True)


async def _evaluate(sessions: SessionManager, session_id: str, _: None) -> tuple[int, bytes]:
    return 200, _REWARD.dump_json(await sessions.evaluate(session_id), by_alias=True)


async def _close(sessions: SessionManager, session_id: str, _: None) -> tuple[int, bytes]:
    await sessions.close(session_id)
    return 204, b""


_Route = tuple[type[BaseModel] | None, _Handler]  # the body's model (None: the route takes none), handler
_ACTIONS: dict[str, _Route] = {"step": (StepRequest, _step), "evaluate": (None, _evaluate)}


def _route(method: str, path: str) -> tuple[str, _Route] | None:
    """(session id, route) of a session route, matched as FastAPI matches it; None for any other."""
    if path == "/sessions":
        return ("", (CreateSession, _create)) if method == "POST" else None
    parts = path.split("/")  # "", "sessions", id[, action]
    if parts[:2] != ["", "sessions"] or len(parts) not in (3, 4) or not parts[2]:
        return None
    if len(parts) == 3:
        return (parts[2], (None, _close)) if method == "DELETE" else None
    action = _ACTIONS.get(parts[3])
    return (parts[2], action) if action is not None and method == "POST" else None


def is_session_route(scope: dict[str, Any]) -> bool:
    """Whether ``SessionRoutes`` answers (or first looks at) this request."""
    return (
        scope["type"] == "http"
        and not scope.get("root_path")
        and _route(scope["method"], scope["path"]) is not None
    )


def _json_content(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether FastAPI parses the body as JSON: the first content type, application/json or
    application/*+json as the email parser FastAPI uses reads it."""
    for name, value in headers:
        if name == b"content-type":
            return _is_json(value)
    return False


@functools.lru_cache(maxsize=64)
def _is_json(content_type: bytes) -> bool:
    message = email.message.Message()
    message["content-type"] = content_type.decode("latin-1")
    sub = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (sub == "json" or sub.endswith("+json"))


class SessionRoutes:
    """ASGI middleware: the session routes' well-formed requests answered here (see the module)."""

    def __init__(self, app: Any, sessions: SessionManager) -> None:
        self.app, self.sessions = app, sessions

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        found = (
            _route(scope["method"], scope["path"])
            if scope["type"] == "http" and not scope.get("root_path")
            else None
        )
        if found is None:
            return await self.app(scope, receive, send)
        session_id, (model, handler) = found
        messages, chunks = [], []
        while True:
            message = await receive()
            messages.append(message)
            chunks.append(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        body: Any = None
        if model is not None:
            body = _parsed(model, b"".join(chunks), scope["headers"])
        if (model is not None and body is None) or messages[-1]["type"] != "http.request":
            replay = iter(messages)

            async def replayed() -> dict[str, Any]:
                return next(replay, None) or await receive()

            return await self.app(scope, replayed, send)  # FastAPI answers, as it always has
        headers: list[tuple[bytes, bytes]] = []
        try:
            status, reply = await handler(self.sessions, session_id, body)
        except EnvServerError as exc:
            status, error, extra = env_error_reply(exc)
            reply = json.dumps(error, ensure_ascii=False, separators=(",", ":")).encode()  # as JSONResponse
            headers = [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]
        if reply:  # as FastAPI's JSONResponse: a 204 carries the type but no length
            headers.append((b"content-length", b"%d" % len(reply)))
        headers.append((b"content-type", b"application/json"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": reply})


def _parsed(model: type[BaseModel], raw: bytes, headers: list[tuple[bytes, bytes]]) -> BaseModel | None:
    """The body as ``model`` as FastAPI reads it (json.loads, then validation); None when it is
    not JSON or does not validate, for the FastAPI route to answer with its own error."""
    if not raw or not _json_content(headers):
        return None
    try:
        return model.model_validate(json.loads(raw))
    except (ValueError, ValidationError, RecursionError):  # JSONDecodeError and UnicodeDecodeError too
        return None
