"""Sessions: live environment instances with their sandboxes, shared by the HTTP service and the
in-process client, so both behave the same and raise the same typed errors."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from env_server.environment import ToolEnvironment
from env_server.pools import PoolSet
from env_server.registry import UnknownEnvironment, make, registry, spec
from env_server.types import Message, Observation, RewardResult, SessionInfo, StepResult, ToolCall, ToolStatus
from env_server.wrappers import Wrapper
from pqrl import faults
from pqrl.finite import nonfinite_path
from pqrl.text import clipped
from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from sandboxes.pool import SandboxPool
from sandboxes.protocol import ImageMissing, SandboxCallFailed, SandboxError, SandboxUnavailable

__all__ = [
    "BackendDown",
    "BadTask",
    "EnvServerError",
    "EnvironmentBroken",
    "GraderFailure",
    "InfraFailure",
    "InvalidRequest",
    "NotFound",
    "SessionDone",
    "SessionManager",
    "TooManySessions",
    "UnknownEnv",
]

log = logging.getLogger(__name__)


class EnvServerError(Exception):
    """Base of the errors both clients raise; ``status`` is the HTTP status that carries it."""

    status = 500
    code = "internal"


class NotFound(EnvServerError):
    status, code = 404, "not_found"


class UnknownEnv(NotFound):
    """No environment of that id is registered here: every task of it would fail the same way."""

    code = "unknown_environment"


class SessionDone(EnvServerError):
    status, code = 409, "session_done"


class RequestConflict(EnvServerError):
    """A request id came back with another body: a client bug, never answered with the old reply."""

    status, code = 409, "request_id_conflict"


class InvalidRequest(EnvServerError):
    status, code = 422, "invalid_request"


class BadTask(InvalidRequest):
    """The task itself is wrong (its reset rejects it, its grader fails its own gold): not retried."""

    code = "bad_task"


class BackendDown(EnvServerError):
    """The sandbox backend (Docker) does not answer: no sandboxed session can open until it does."""

    status, code = 503, "sandbox_backend_down"


class TooManySessions(EnvServerError):
    status, code = 429, "too_many_sessions"

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EnvironmentBroken(EnvServerError):
    """The environment's own code failed (it cannot be loaded, its reset crashed or ran a sandbox
    call that failed, it replied a number that is not finite): a bug to fix, never the policy's,
    so the episode is ``failed_infra``; the same request would fail again, so it is not retried."""

    status, code = 500, "environment_error"


class InfraFailure(EnvServerError):
    """The environment's infrastructure (its sandbox) failed: the rollout is ``failed_infra``."""

    status, code = 502, "infra_failure"


class GraderFailure(InfraFailure):
    """The environment's grader raised (or gave a reward that cannot be sent): its own fault, never
    the policy's, so the episode is ``failed_infra`` like any infrastructure failure."""

    status, code = 500, "grader_failure"


_DONE_RESULTS_KEPT = 64  # replies remembered per session for retried step requests
_CREATES_REMEMBERED = 10_000  # create request ids remembered for retried creates
_CAUSE_CHARS = 2000  # of a grader's exception, in the error's detail


@dataclass
class _Session:
    id: str
    env_id: str
    env: ToolEnvironment | Wrapper
    sandbox: DockerSandbox | None
    pool: SandboxPool | None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    replies: OrderedDict[str, tuple[str, StepResult]] = field(default_factory=OrderedDict)
    done: bool = False
    broken_by_agent: str | None = None  # why the agent's own command ended its sandbox


class SessionManager:
    """Creates, steps and reaps sessions. One per server process (or per LocalEnvClient)."""

    def __init__(
        self,
        *,
        max_sessions: int = 1024,
        ttl_s: float = 3600.0,
        pool_size: int = 2,
        max_warm: int | None = None,
        docker_api: DockerAPI | None = None,
        run: str = "env-server",
    ) -> None:
        """``pool_size`` spares per image, ``max_warm`` (default twice that) across all images."""
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.pool_size = pool_size
        self.run = run
        self._sessions: dict[str, _Session] = {}
        self._created: OrderedDict[str, tuple[str, SessionInfo]] = OrderedDict()
        self._create_locks: dict[str, tuple[asyncio.Lock, int]] = {}  # request id -> (lock, users)
        self._creating = 0
        self.metrics = CollectorRegistry()
        self._live = Gauge("pqrl_env_sessions_live", "Sessions open now", registry=self.metrics)
        self._step_seconds = Histogram(
            "pqrl_env_step_seconds", "Step latency inside the server", ["env"], registry=self.metrics,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )  # fmt: skip
        self._errors = Counter("pqrl_env_errors", "Errors by kind", ["kind"], registry=self.metrics)
        self.sandbox_pools = PoolSet(
            self.metrics, pool_size=pool_size, max_warm=max_warm, run=run, docker_api=docker_api
        )

    # ---------------------------------------------------------------- API

    def environments(self) -> list[dict[str, Any]]:
        """Registered environments with their tools (loading each class)."""
        out = []
        for env_id, s in sorted(registry().items()):
            try:
                cls = s.load()
                tools = cls.tool_schemas()
                where = nonfinite_path(tools)
                if where is not None:  # a default of float("inf"): it would reach the reply as Infinity
                    raise TypeError(f"its tool schemas hold a number that is not finite at tools{where}")
                out.append({"id": env_id, "needs_sandbox": cls.needs_sandbox, "tools": tools,
                            "max_turns": s.max_turns})  # fmt: skip
            except (ImportError, TypeError) as e:
                out.append({"id": env_id, "error": clipped(str(e), _CAUSE_CHARS), "tools": []})
        return out

    async def create(
        self,
        env_id: str,
        task: dict[str, Any],
        seed: int | None = None,
        env_kwargs: dict[str, Any] | None = None,
        request_id: str | None = None,
    ) -> SessionInfo:
        """Opens a session of ``env_id`` (with ``env_kwargs`` over its registered defaults).

        A ``request_id`` seen before with the same body returns the session that request opened, so
        a client may retry a create whose reply was lost without opening a second session; with
        another body it is refused (``RequestConflict``).
        """
        if request_id is not None:
            fingerprint = _fingerprint([env_id, task, seed, env_kwargs or {}])
            async with self._create_lock(request_id):
                known = self._created.get(request_id)
                if known is not None:
                    info = _replayed(request_id, known, fingerprint)
                    if info.session_id in self._sessions:
                        return info
                info = await self.create(env_id, task, seed, env_kwargs)
                self._created[request_id] = (fingerprint, info)
                while len(self._created) > _CREATES_REMEMBERED:
                    self._created.popitem(last=False)
                return info
        if len(self._sessions) + self._creating >= self.max_sessions:
            self._error("too_many_sessions")
            raise TooManySessions(f"{self.max_sessions} sessions are open; close some or retry later", 1.0)
        self._creating += 1
        try:
            return await self._create(env_id, task, seed, env_kwargs or {})
        finally:
            self._creating -= 1

    async def step(
        self, session_id: str, tool_calls: list[ToolCall], request_id: str | None = None
    ) -> StepResult:
        s = self._get(session_id)
        async with s.lock:
            fingerprint = ""
            if request_id is not None:  # every field of every call (asdict would deep-copy them)
                fingerprint = _fingerprint([[getattr(c, f.name) for f in fields(c)] for c in tool_calls])
                if request_id in s.replies:  # a retry: applied once, answered again
                    return _replayed(request_id, s.replies[request_id], fingerprint)
            if s.done:
                self._error("step_after_done")
                raise SessionDone(f"session {session_id} is done; evaluate or close it")
            t0 = time.perf_counter()
            try:
                result = await s.env.step(tool_calls)
            except SandboxError as e:
                s.done = True
                if not e.agent_caused:
                    self._error("infra")
                    raise InfraFailure(f"session {session_id}: sandbox failed: {e}") from e
                # the policy broke its own sandbox: its failure (reward 0), not the infrastructure's
                self._error("sandbox_broken_by_agent")
                s.broken_by_agent = str(e)
                result = _broken_by_agent(tool_calls, str(e))
            finally:
                s.last_used = time.monotonic()
            self._step_seconds.labels(s.env_id).observe(time.perf_counter() - t0)
            try:
                _replyable(result, "step")
            except ValueError as e:  # applied but unanswerable: the episode cannot go on
                s.done = True
                self._error("environment_error")
                raise EnvironmentBroken(
                    clipped(f"session {session_id}: {s.env_id}: {e}", _CAUSE_CHARS)
                ) from e
            s.done = result.done
            if request_id is not None:
                s.replies[request_id] = (fingerprint, result)
                while len(s.replies) > _DONE_RESULTS_KEPT:
                    s.replies.popitem(last=False)
            return result

    async def evaluate(self, session_id: str) -> RewardResult:
        s = self._get(session_id)
        async with s.lock:
            if s.broken_by_agent is not None:
                return RewardResult(reward=0.0, info={"reason": "a command broke the sandbox",
                                                      "cause": s.broken_by_agent})  # fmt: skip
            try:
                return _sendable(await s.env.evaluate())
            except SandboxError as e:
                self._error("infra")
                raise InfraFailure(f"session {session_id}: sandbox failed during evaluation: {e}") from e
            except faults.BadTask as e:  # the task's own reference fails: no episode of it can be graded
                self._error("bad_task")
                raise BadTask(clipped(f"session {session_id}: {s.env_id}: {type(e).__name__}: {e}",
                                      _CAUSE_CHARS)) from e  # fmt: skip
            except Exception as e:  # a grader bug costs this episode only, never the server or the group
                self._error("grader")
                log.error("session %s (%s): the grader failed", session_id, s.env_id, exc_info=e)
                cause = f"{type(e).__name__}: {e}"[:_CAUSE_CHARS]
                raise GraderFailure(f"session {session_id}: the grader of {s.env_id} failed: {cause}") from e
            finally:
                s.last_used = time.monotonic()

    async def close(self, session_id: str) -> None:
        s = self._sessions.pop(session_id, None)
        if s is None:
            raise NotFound(f"no session {session_id}")
        self._live.set(len(self._sessions))
        async with s.lock:  # let a running step finish before its environment goes away
            await self._dispose(s)

    async def reap_expired(self) -> int:
        """Closes sessions idle for longer than the TTL; returns how many."""
        cutoff = time.monotonic() - self.ttl_s
        stale = [sid for sid, s in self._sessions.items() if s.last_used < cutoff and not s.lock.locked()]
        for sid in stale:
            with contextlib.suppress(NotFound):
                await self.close(sid)
        return len(stale)

    async def shutdown(self) -> None:
        for sid in list(self._sessions):
            with contextlib.suppress(NotFound):
                await self.close(sid)
        await self.sandbox_pools.close()
        if self._docker_api is not None:
            await self._docker_api.close()

    async def backend_down(self) -> str | None:
        """Why the sandbox backend cannot serve (Docker does not answer its ping); None when it can."""
        try:
            self._docker_api = self._docker_api or DockerAPI()
            async with asyncio.timeout(5.0):
                await self._docker_api.ping()
        except (SandboxError, TimeoutError) as e:
            return str(e) or "the Docker engine did not answer its ping within 5 s"
        return None

    @property
    def live(self) -> int:
        return len(self._sessions)

    @property
    def _pools(self) -> dict[SandboxSettings, SandboxPool]:
        """The open warm pools by settings."""
        return {p.settings: p for p in self.sandbox_pools.pools()}

    @property
    def _docker_api(self) -> DockerAPI | None:
        """The Docker client the pools share (made on first use, closed by ``shutdown``)."""
        return self.sandbox_pools.docker_api

    @_docker_api.setter
    def _docker_api(self, api: DockerAPI | None) -> None:
        self.sandbox_pools.docker_api = api

    # ---------------------------------------------------------------- internals

    @contextlib.asynccontextmanager
    async def _create_lock(self, request_id: str) -> AsyncIterator[None]:
        """Serializes a create with its retries (a retry may arrive while the first still runs)."""
        lock, users = self._create_locks.get(request_id, (asyncio.Lock(), 0))
        self._create_locks[request_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._create_locks[request_id]
            if users == 1:
                del self._create_locks[request_id]
            else:
                self._create_locks[request_id] = (lock, users - 1)

    def _get(self, session_id: str) -> _Session:
        s = self._sessions.get(session_id)
        if s is None:
            self._error("not_found")
            raise NotFound(f"no session {session_id} (closed, expired, or on another server)")
        s.last_used = time.monotonic()
        return s

    def _error(self, kind: str) -> None:
        self._errors.labels(kind).inc()

    async def _create(
        self, env_id: str, task: dict[str, Any], seed: int | None, env_kwargs: dict[str, Any]
    ) -> SessionInfo:
        try:
            spec(env_id).load()
        except UnknownEnvironment as e:
            self._error("not_found")
            raise UnknownEnv(str(e)) from None
        except (ImportError, TypeError) as e:
            self._error("environment_error")
            raise EnvironmentBroken(clipped(str(e), _CAUSE_CHARS)) from None
        try:
            env = make(env_id, **env_kwargs)
        except TypeError as e:
            self._error("bad_task")
            raise BadTask(clipped(f"{env_id} rejected its env_kwargs: {e}", _CAUSE_CHARS)) from None
        inner = env.unwrapped if isinstance(env, Wrapper) else env
        sandbox = pool = None
        try:
            if inner.needs_sandbox:
                settings = inner.sandbox_settings_for(task) or SandboxSettings()  # the task's image, say
                pool, sandbox = await self.sandbox_pools.acquire(settings)
                inner.sandbox = sandbox
            observation = await env.reset(task=task, seed=seed)
        except BaseException as e:
            await self._dispose(_Session("", env_id, env, sandbox, pool))  # nothing acquired may leak
            failure = self._reset_failure(env_id, e)
            if failure is e:
                raise
            if isinstance(failure, InfraFailure) and (down := await self.backend_down()) is not None:
                failure = BackendDown(clipped(f"{env_id}: the sandbox backend is down: {down}", _CAUSE_CHARS))
            raise failure from e
        try:  # an observation that cannot be sent fails here, as the environment's, not in the reply
            _replyable(observation, "reset")
        except ValueError as e:
            await self._dispose(_Session("", env_id, env, sandbox, pool))
            self._error("environment_error")
            raise EnvironmentBroken(clipped(f"{env_id}: {e}", _CAUSE_CHARS)) from e
        sid = uuid.uuid4().hex
        self._sessions[sid] = _Session(sid, env_id, env, sandbox, pool)
        self._live.set(len(self._sessions))
        return SessionInfo(session_id=sid, env_id=env_id, observation=observation)

    def _reset_failure(self, env_id: str, e: BaseException) -> BaseException:
        """What a reset that raised ``e`` answers; every message bounded."""
        cause = f"{type(e).__name__}: {e}"
        if isinstance(e, ImageMissing):  # no retry builds it; a task may name its own image (repo-v1)
            self._error("bad_task")
            return BadTask(clipped(f"{env_id}: {e}", _CAUSE_CHARS))
        if isinstance(e, SandboxError) and not isinstance(e, SandboxUnavailable):
            self._error("infra")
            return InfraFailure(clipped(f"{env_id}: sandbox unavailable: {e}", _CAUSE_CHARS))
        if isinstance(e, SandboxCallFailed):
            # the sandbox is alive and answered: the call the environment's setup made failed
            self._error("environment_error")
            return EnvironmentBroken(
                clipped(f"{env_id}: reset failed: a sandbox call of its setup failed: {e}", _CAUSE_CHARS)
            )
        if isinstance(e, SandboxUnavailable):
            self._error("backend_down")
            return BackendDown(clipped(f"{env_id}: the sandbox backend is down: {e}", _CAUSE_CHARS))
        if isinstance(e, KeyError | ValueError | TypeError | faults.BadTask):
            self._error("bad_task")
            return BadTask(clipped(f"{env_id} rejected the task: {cause}", _CAUSE_CHARS))
        if isinstance(e, Exception):
            self._error("environment_error")
            return EnvironmentBroken(clipped(f"{env_id}: reset failed: {cause}", _CAUSE_CHARS))
        return e  # cancelled, interrupted: not the environment's to answer

    async def _dispose(self, s: _Session) -> None:
        try:
            await s.env.close()
        except Exception as e:
            log.warning("closing environment %s failed: %s", s.env_id, e)
        if s.pool is not None:
            self.sandbox_pools.release(s.pool, s.sandbox)


def _sendable(result: Any) -> RewardResult:
    """The grader's answer if it can be sent and trained on: a RewardResult with a finite reward
    and JSON-encodable info (otherwise it fails here, as the grader's fault, not in the reply)."""
    _replyable(result, "evaluate")
    return result


def _replyable(reply: Any, what: str) -> None:
    """ValueError naming the field unless ``reply`` can be sent as it is: JSON would carry a NaN
    as ``NaN`` (not JSON) or pydantic as ``null`` (silently), and a NaN reward trains on garbage."""
    expected = {"reset": Observation, "step": StepResult, "evaluate": RewardResult}[what]
    if not isinstance(reply, expected):
        raise ValueError(f"{what} returned {type(reply).__name__}, not {expected.__name__}")
    where = nonfinite_path(reply.model_dump())  # the fields as set, assignments after validation too
    if where is not None:
        raise ValueError(f"{what} replied a number that is not finite (NaN or infinite) at {where}")
    try:
        reply.model_dump_json()
    except ValueError as e:  # pydantic's serialization error is a ValueError
        raise ValueError(f"{what} replied something that is not JSON: {type(e).__name__}: {e}") from None


def _fingerprint(body: Any) -> str:
    """What identifies a request's body, to tell a retry from a reused request id."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _replayed(request_id: str, remembered: tuple[str, Any], fingerprint: str) -> Any:
    """The remembered reply of a retried request; the same id with another body is a conflict."""
    seen, reply = remembered
    if seen != fingerprint:
        raise RequestConflict(f"request_id {request_id!r} was already used with a different body")
    return reply


def _broken_by_agent(tool_calls: list[ToolCall], cause: str) -> StepResult:
    """The end of an episode whose command killed or flooded its sandbox: every call of the turn
    answered with the cause, the episode done."""
    messages = [
        Message(role="tool", name=c.name, tool_call_id=c.id, status=ToolStatus.ERROR,
                content=f"Error: the sandbox stopped while running this command ({cause})")
        for c in tool_calls
    ]  # fmt: skip
    return StepResult(messages=messages, done=True, info={"sandbox_broken_by_agent": cause})
