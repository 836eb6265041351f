"""The env server: registered tool environments as sessions over HTTP (``pqrl env-server``).

Routes (all but ``/healthz`` and ``/readyz`` need ``Authorization: Bearer <token>``):

    GET    /healthz                          liveness, no auth
    GET    /readyz                           readiness (the sandbox backend answers), no auth; 503 + cause
    GET    /metrics                          Prometheus text
    GET    /environments                     registered environments and their tools
    POST   /sessions                         {env_id, task, seed} -> session id + first observation
    POST   /sessions/{id}/step               {tool_calls, request_id} -> tool messages, done
    POST   /sessions/{id}/evaluate           -> reward
    DELETE /sessions/{id}                    close (releases the sandbox)

Errors carry ``{"error": code, "detail": message}``: 401 no/bad token, 403 wrong token, 404
unknown session or environment (``unknown_environment``), 409 step after done, 413 body too large,
422 invalid input (``bad_task``: the task's reset rejects it or its grader fails its own gold),
429 session limit (with ``Retry-After``), 500 the environment's own code failed
(``environment_error``: it cannot load, its reset raised or ran a sandbox call that failed, or a
reply of it holds a number that is not finite; ``grader_failure``: its grader raised or scored
NaN; either way that episode is ``failed_infra``), 502 the session's sandbox failed
(``failed_infra``), 503 the sandbox backend is down (``sandbox_backend_down``).
A step's ``request_id`` makes retries safe: the same id is applied once and answered again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import generate_latest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from env_server.fast_path import SessionRoutes, is_session_route
from env_server.sessions import EnvServerError, SessionManager
from env_server.types import ErrorBody, RewardResult, SessionInfo, StepResult
from env_server.wire import CreateSession, StepRequest, env_error_reply

__all__ = ["ServerSettings", "create_app"]

log = logging.getLogger(__name__)


_OPEN_PATHS = ("/healthz", "/readyz")  # probes: no token


class ServerSettings(BaseSettings):
    """Read from ``PQRL_ENV_*`` environment variables. The token is required unless insecure."""

    model_config = SettingsConfigDict(env_prefix="PQRL_ENV_", allow_inf_nan=False)

    token: str | None = Field(default=None, description="bearer token clients must send")
    insecure_local: bool = Field(default=False, description="allow running without a token")
    max_sessions: int = Field(default=1024, ge=1)
    session_ttl_s: float = Field(default=3600.0, gt=0)
    reap_interval_s: float = Field(default=30.0, gt=0)
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    sandbox_pool_size: int = Field(default=2, ge=0)
    run: str = Field(default="env-server", description="the pqrl.run label of this server's sandboxes")
    # how it is served (env_server.http_guard): a slow client cannot hold connections open
    request_read_timeout_s: float = Field(default=10.0, gt=0, description="a request's headers and body")
    max_connections: int = Field(default=2048, ge=1, description="open at once; more are answered 503")
    keep_alive_s: float = Field(default=30.0, gt=0, description="an idle keep-alive connection")

    def check(self) -> None:
        if not self.token and not self.insecure_local:
            raise ValueError("the env server needs a token (PQRL_ENV_TOKEN) or --insecure-local")


# Module level: FastAPI resolves these (string) annotations in the module's namespace.
_bearer = HTTPBearer(auto_error=False)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


class _BodyLimit:
    """413 for bodies over the limit, declared or streamed, before anything parses them: the
    body (at most ``limit`` bytes) is read here and replayed to the app."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await _too_large(self.limit)(scope, receive, send)
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > self.limit:
                return await _too_large(self.limit)(scope, receive, send)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        replay = iter(messages)

        async def replayed() -> dict[str, Any]:
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)


class _Unexpected:
    """A bug of the server or an environment answers the documented 500 body here, and the
    traceback is logged. Nothing re-raises it: Starlette's outermost error middleware sends its
    response and then re-raises for the server to log, and the server could close the connection
    before the client had read that response (the client saw a ReadError, not the body)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            log.exception("unexpected error answering %s %s", scope.get("method"), scope.get("path"))
            if started:  # too late for a body: the connection is the only way to say it failed
                raise
            body = {"error": "internal", "detail": f"{type(exc).__name__}: {exc}"[:2000]}
            await JSONResponse(body, status_code=500)(scope, receive, send)


class _TokenGate:
    """Checks the bearer token before anything reads the body (a bad body must not answer 422
    to a caller without a token). /healthz and /readyz are open."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.token is None or scope["path"] in _OPEN_PATHS:
            return await self.app(scope, receive, send)
        # exactly one header: with two, which one counts would depend on who reads them
        headers = [v for k, v in scope.get("headers") or [] if k == b"authorization"]
        scheme, _, given = (headers[0] if len(headers) == 1 else b"").decode("latin-1").partition(" ")
        if len(headers) > 1:
            body = {"error": "unauthorized", "detail": "more than one Authorization header"}
            response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        elif scheme.lower() != "bearer" or not given:
            body = {"error": "unauthorized", "detail": "missing bearer token"}
            response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        elif not hmac.compare_digest(given.encode(), self.token.encode()):
            response = JSONResponse({"error": "unauthorized", "detail": "invalid token"}, status_code=403)
        else:
            return await self.app(scope, receive, send)
        await response(scope, receive, send)


def _too_large(limit: int) -> JSONResponse:
    return JSONResponse(
        {"error": "body_too_large", "detail": f"request body exceeds {limit} bytes"}, status_code=413
    )


def create_app(settings: ServerSettings | None = None, manager: SessionManager | None = None) -> FastAPI:
    """The ASGI app. Raises ValueError when neither a token nor insecure mode is configured."""
    settings = settings or ServerSettings()
    settings.check()
    sessions = manager or SessionManager(
        max_sessions=settings.max_sessions,
        ttl_s=settings.session_ttl_s,
        pool_size=settings.sandbox_pool_size,
        run=settings.run,
    )
    # The OpenAPI spec is served (behind the token, like every route but the probes); no HTML docs.
    app = _EnvServerApp(
        title="pqrl env server",
        version="1",
        lifespan=_lifespan(settings, sessions),
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.add_middleware(_Unexpected)  # added first: the innermost of these, around the routes
    app.add_middleware(_BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(_TokenGate, token=settings.token)  # added last: runs first
    # the same three around the session routes' direct path; what it does not answer goes to FastAPI
    fallback = functools.partial(FastAPI.__call__, app)
    direct = SessionRoutes(fallback, sessions)
    app.direct = _TokenGate(_BodyLimit(_Unexpected(direct), settings.max_body_bytes), settings.token)
    app.state.sessions = sessions
    _add_error_handlers(app)
    # Every route on this router needs the token; the probes sit on the app itself.
    api = APIRouter(dependencies=[Depends(_authorizer(settings))], responses=_ERROR_RESPONSES)
    _add_info_routes(app, api, sessions)
    _add_session_routes(api, sessions)
    app.include_router(api)
    return app


class _EnvServerApp(FastAPI):
    """FastAPI, but a request for a session route goes to ``direct`` (env_server.fast_path behind
    the same guards): FastAPI's own middleware and routing cost more CPU than a no-op step."""

    direct: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if is_session_route(scope):
            return await self.direct(scope, receive, send)
        await super().__call__(scope, receive, send)


def _lifespan(
    settings: ServerSettings, sessions: SessionManager
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Reaps expired sessions in the background while the app runs; shuts the sessions down after."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def reap_forever() -> None:
            while True:
                await asyncio.sleep(settings.reap_interval_s)
                try:
                    await sessions.reap_expired()
                except Exception as e:  # one failed pass must not end reaping for good
                    log.warning("session reaper pass failed: %r", e)

        reaper = asyncio.create_task(reap_forever())
        yield
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        await sessions.shutdown()

    return lifespan


def _authorizer(settings: ServerSettings) -> Callable[[Credentials], Awaitable[None]]:
    """The dependency that checks the bearer token (a no-op with --insecure-local)."""

    async def authorized(credentials: Credentials) -> None:
        if settings.token is None:
            return  # --insecure-local
        if credentials is None:
            raise _AuthError(401, "missing bearer token")
        if not hmac.compare_digest(credentials.credentials.encode(), settings.token.encode()):
            raise _AuthError(403, "invalid token")

    return authorized


def _add_error_handlers(app: FastAPI) -> None:
    """Every error answers ``{"error": code, "detail": message}``."""

    @app.exception_handler(EnvServerError)
    async def env_error(request: Request, exc: EnvServerError) -> JSONResponse:
        status, body, headers = env_error_reply(exc)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(_AuthError)
    async def auth_error(request: Request, exc: _AuthError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(
            {"error": "unauthorized", "detail": exc.detail}, status_code=exc.status, headers=headers
        )

    @app.exception_handler(StarletteHTTPException)
    async def framework_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "error"
        )
        body = {"error": code, "detail": str(exc.detail)}
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"error": "invalid_request", "detail": problems}, status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # a bug of the server or an environment: still the documented body (the traceback is logged)
        return JSONResponse({"error": "internal", "detail": f"{type(exc).__name__}: {exc}"[:2000]}, 500)


# documented for every route behind the token, so a client (or a fuzzer) can validate error bodies
# (as JSON, inline: /metrics answers text/plain when it succeeds, JSON when it fails)
_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": what, "content": {"application/json": {"schema": ErrorBody.model_json_schema()}}}
    for status, what in [
        (401, "no bearer token"), (403, "wrong token"), (404, "no such session or route"),
        (409, "session done, or a request id reused with another body"), (413, "body too large"),
        (422, "invalid request"), (429, "too many sessions (Retry-After)"),
        (500, "the environment's own code failed (grader_failure: its grader raised)"),
        (502, "the session's sandbox failed"), (503, "the sandbox backend (Docker) is down"),
    ]
}  # fmt: skip


def _add_info_routes(app: FastAPI, api: APIRouter, sessions: SessionManager) -> None:
    """/healthz and /readyz (open, on the app), /metrics and /environments (behind the token, on ``api``)."""

    @app.get("/healthz", operation_id="health")
    async def health() -> dict[str, Any]:
        return {"ok": True, "sessions": sessions.live}

    @app.get("/readyz", operation_id="ready")
    async def ready() -> JSONResponse:
        down = await sessions.backend_down()
        if down is not None:
            return JSONResponse({"error": "sandbox_backend_down", "detail": down}, status_code=503)
        return JSONResponse({"ok": True})

    @api.get("/metrics", operation_id="metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(sessions.metrics).decode())

    @api.get("/environments", operation_id="list_environments")
    async def environments() -> list[dict[str, Any]]:
        return sessions.environments()


def _add_session_routes(api: APIRouter, sessions: SessionManager) -> None:
    """Create, step, evaluate and close a session."""

    @api.post("/sessions", operation_id="create_session", status_code=201)
    async def create(body: CreateSession) -> SessionInfo:
        return await sessions.create(body.env_id, body.task, body.seed, body.env_kwargs, body.request_id)

    @api.post("/sessions/{session_id}/step", operation_id="step")
    async def step(session_id: str, body: StepRequest) -> StepResult:
        return await sessions.step(session_id, [c.to_call() for c in body.tool_calls], body.request_id)

    @api.post("/sessions/{session_id}/evaluate", operation_id="evaluate")
    async def evaluate(session_id: str) -> RewardResult:
        return await sessions.evaluate(session_id)

    @api.delete("/sessions/{session_id}", operation_id="close_session", status_code=204)
    async def close(session_id: str) -> None:
        await sessions.close(session_id)


class _AuthError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        self.status, self.detail = status, detail
