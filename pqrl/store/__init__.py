"""The Redis trajectory store: finished groups, the task queue and the policy version of one run.

``TrajectoryStore(url, run_id)`` owns one Redis connection and hands it to one small part per
concern, each owning its keys of run ``R`` (the braces keep a run's keys in one Redis Cluster slot;
``RunKeys`` names them all):

- ``.groups`` (GroupStream): ``pqrl:{R}:groups``, stream, one entry per finished group, read by
  trainers through consumer groups, trimmed as acknowledged, bounded by ``max_backlog``
- ``.dead_letters`` (DeadLetters): ``pqrl:{R}:dead``, group entries that failed to decode, kept with
  the reason, never dropped
- ``.tasks`` (TaskQueue): ``pqrl:{R}:tasks``, stream, the run's task queue (JSON task specs), and
  ``pqrl:{R}:task-batches``, the batches queued so far
- ``.sampler`` (SamplerCursor): ``pqrl:{R}:sampler``, hash: ``config`` (the task sampler's JSON,
  tasks.sampler), ``position`` (next slot); ``pqrl:{R}:outcomes``, hash: per sampled task, its
  groups in a row without signal and the draws it skipped since
- ``.policy`` (PolicyVersion): ``pqrl:{R}:policy``, hash: ``version`` (int, starts at 0),
  ``weights`` (where they are), ``updated``
- ``.gate`` (AdmissionGate): ``pqrl:{R}:gate``, the staleness gate's counters, with
  ``pqrl:{R}:gate-running`` (places per rollout manager) and ``pqrl:{R}:alive:<manager>`` (beats)
- ``.status`` (JobStatus): ``pqrl:{R}:status``, the job's latest figures for ``pqrl status``
- ``.pins`` (RunPins): ``pqrl:{R}:settings`` (the key's first name), what every process of the run
  must share (sampling, group shape, model, task plan), pinned by the first process that joins it

Every write that must be atomic when several producers, managers and trainers share a run (acking
with trimming, publishing a policy version, admission, claiming a sampler slot) is one Lua script.
An unreachable Redis raises ``StoreUnavailable`` naming the URL (password redacted).

Durability is the Redis server's setting (see pqrl.redis_server): with ``appendfsync always`` a
restart loses no acknowledged write; the default ``everysec`` can lose about the last second.
"""

from __future__ import annotations

from pqrl.store.connection import (
    Backpressure,
    RunKeys,
    StoreError,
    StoreUnavailable,
    connect,
    redacted,
    redis_errors,
)
from pqrl.store.dead_letters import DeadLetters
from pqrl.store.gate import AdmissionGate
from pqrl.store.groups import GroupEntry, GroupStream
from pqrl.store.policy import PolicyState, PolicyVersion
from pqrl.store.run_pins import RunPins
from pqrl.store.sampler import SamplerClaim, SamplerCursor, SamplerState, TaskOutcome
from pqrl.store.status import JobStatus
from pqrl.store.tasks import TaskEntry, TaskQueue

__all__ = [
    "AdmissionGate",
    "Backpressure",
    "DeadLetters",
    "GroupEntry",
    "GroupStream",
    "JobStatus",
    "PolicyState",
    "PolicyVersion",
    "RunKeys",
    "RunPins",
    "SamplerClaim",
    "SamplerCursor",
    "SamplerState",
    "TaskOutcome",
    "StoreError",
    "StoreUnavailable",
    "TaskEntry",
    "TaskQueue",
    "TrajectoryStore",
]


class TrajectoryStore:
    """Async access to one run's keys in Redis, one part per concern on one shared connection.

    Args:
        url: Redis URL, e.g. ``redis://127.0.0.1:6379/0``.
        run_id: the run whose keys this store reads and writes.
        max_backlog: the most groups the stream holds before ``groups.put`` reports back-pressure;
            0 means unbounded.
    """

    def __init__(self, url: str, run_id: str, *, max_backlog: int = 1024) -> None:
        keys = RunKeys(run_id)
        if max_backlog < 0:
            raise ValueError(f"max_backlog must be >= 0, got {max_backlog}")
        self.keys = keys
        self.url_redacted = redacted(url)
        self.redis = connect(url)
        part = (self.redis, keys, self.url_redacted)
        self.dead_letters = DeadLetters(*part)
        self.groups = GroupStream(*part, dead_letters=self.dead_letters, max_backlog=max_backlog)
        self.tasks = TaskQueue(*part)
        self.sampler = SamplerCursor(*part)
        self.policy = PolicyVersion(*part)
        self.gate = AdmissionGate(*part, policy=self.policy)
        self.status = JobStatus(*part)
        self.pins = RunPins(*part)

    @property
    def run_id(self) -> str:
        return self.keys.run_id

    async def __aenter__(self) -> TrajectoryStore:
        await self.ping()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.redis.aclose()

    @redis_errors
    async def ping(self) -> None:
        await self.redis.ping()
