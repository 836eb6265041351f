"""What every part of the store shares: its errors, the run's key names and the Redis connection.

The parts (``GroupStream``, ``TaskQueue``, ...) are ``RunPart`` objects holding the one connection
the ``TrajectoryStore`` opened, the run's ``RunKeys`` and the redacted URL that error messages name.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
import redis.exceptions

from pqrl.store.parts import sends_parts

__all__ = [
    "Backpressure",
    "RunKeys",
    "RunPart",
    "StoreError",
    "StoreUnavailable",
    "connect",
    "decode_str",
    "redacted",
    "redis_errors",
]

P = ParamSpec("P")
R = TypeVar("R")


class StoreError(RuntimeError):
    """Base class of the store's errors."""


class StoreUnavailable(StoreError):
    """Redis could not be reached; the message names the URL (password redacted)."""


class Backpressure(StoreError):
    """The run's backlog of unconsumed groups is full: slow down until trainers catch up."""

    def __init__(self, backlog: int, limit: int) -> None:
        super().__init__(f"trajectory backlog full: {backlog} groups waiting, limit {limit}")
        self.backlog = backlog
        self.limit = limit


@dataclass(frozen=True, slots=True)
class RunKeys:
    """Every Redis key of run ``run_id``; the braces keep them in one Redis Cluster slot."""

    run_id: str

    def __post_init__(self) -> None:
        if not self.run_id or any(c in self.run_id for c in "{}: \t\n"):
            raise ValueError(f"run_id must be non-empty without braces, colons or spaces: {self.run_id!r}")

    @property
    def prefix(self) -> str:
        return f"pqrl:{{{self.run_id}}}"

    @property
    def groups(self) -> str:
        """Stream, one entry per finished group (one binary blob, pqrl.codec)."""
        return f"{self.prefix}:groups"

    @property
    def dead(self) -> str:
        """Stream of group entries that failed to decode, with the reason and the original bytes."""
        return f"{self.prefix}:dead"

    @property
    def tasks(self) -> str:
        """Stream, the run's task queue (JSON task specs)."""
        return f"{self.prefix}:tasks"

    @property
    def dead_tasks(self) -> str:
        """Stream of tasks given up for their own permanent fault: ``task`` (JSON) and ``reason``."""
        return f"{self.prefix}:dead-tasks"

    @property
    def task_batches(self) -> str:
        """Set of the task batch ids already queued (a batch is queued once per run)."""
        return f"{self.prefix}:task-batches"

    @property
    def policy(self) -> str:
        """Hash: ``version`` (int, starts at 0), ``weights`` (where they are), ``updated``."""
        return f"{self.prefix}:policy"

    @property
    def sampler(self) -> str:
        """Hash: ``config`` (the task sampler's JSON, tasks.sampler), ``position`` (next slot)."""
        return f"{self.prefix}:sampler"

    @property
    def outcomes(self) -> str:
        """Hash: per sampled task, its groups in a row without signal (``<task>:flat``) and the
        sampler draws it gave up since it last ran (``<task>:skipped``)."""
        return f"{self.prefix}:outcomes"

    @property
    def gate(self) -> str:
        """Hash: the admission gate's ``accepted`` and ``rejected`` counters (``running``: gate_running)."""
        return f"{self.prefix}:gate"

    @property
    def gate_running(self) -> str:
        """Hash: the groups each rollout manager (holder) has admitted and not yet ended."""
        return f"{self.prefix}:gate-running"

    def alive(self, holder: str) -> str:
        """String with a time to live: ``holder`` beats it while it runs (``alive("")`` is the prefix)."""
        return f"{self.prefix}:alive:{holder}"

    @property
    def status(self) -> str:
        """Hash: the trainer's latest figures (JSON values) for ``pqrl status``."""
        return f"{self.prefix}:status"

    @property
    def pins(self) -> str:
        """String: what every process of the run shares (JSON), pinned by the first to join. The key
        keeps its first name, ``settings``, so runs started before the module's rename resume pinned."""
        return f"{self.prefix}:settings"


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def connect(url: str) -> aioredis.Redis:
    """A client for ``url`` returning bytes, taking ``Parts`` values; it connects lazily and
    reconnects after failures."""
    return sends_parts(aioredis.Redis.from_url(url, decode_responses=False, socket_connect_timeout=5))


class RunPart:
    """One concern of a run's keys, on the connection its ``TrajectoryStore`` owns."""

    def __init__(self, redis: aioredis.Redis, keys: RunKeys, url_redacted: str) -> None:
        self.redis = redis
        self.keys = keys
        self.url_redacted = url_redacted

    @property
    def run_id(self) -> str:
        return self.keys.run_id


def redis_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Turns connection failures of a ``RunPart`` method into StoreUnavailable naming the URL."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        self = args[0]
        try:
            return await fn(*args, **kwargs)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as e:
            raise StoreUnavailable(f"cannot reach Redis at {self.url_redacted}: {e}") from e  # type: ignore[attr-defined]

    return wrapper


def decode_str(b: bytes | str) -> str:
    return b.decode() if isinstance(b, bytes) else b
