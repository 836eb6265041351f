"""The Redis trajectory store: finished groups, the task queue and the policy version of one run.

Keys of run ``R`` (the braces keep a run's keys in one Redis Cluster slot):

- ``pqrl:{R}:groups``  stream, one entry per finished group (one binary blob, pqrl.codec)
- ``pqrl:{R}:dead``    stream of entries that failed to decode, kept with the reason, never dropped
- ``pqrl:{R}:tasks``   stream, the run's task queue (JSON task specs)
- ``pqrl:{R}:policy``  hash: ``version`` (int, starts at 0), ``weights`` (where they are), ``updated``
- ``pqrl:{R}:sampler`` hash: ``config`` (the task sampler's JSON, tasks.sampler), ``position`` (next slot)

Both streams are read through consumer groups (``XREADGROUP`` + ``XACK``): each entry goes to one
consumer of a group, a consumer that dies leaves its entries pending and ``reclaim`` hands them to
another (``XAUTOCLAIM``). ``XACK`` deletes nothing, so after each ack the store trims the stream
below the oldest entry that some group has not yet acknowledged (``XTRIM MINID``; Redis 7.0 has no
ack-trimming of its own). The backlog is therefore the data some consumer still needs, and
``put_group`` refuses new groups while it is at ``max_backlog``: back-pressure that releases as the
trainer consumes, without ever dropping unread data. Acking with trimming and publishing a policy
version are Lua scripts, atomic when several producers and trainers share a run; the backlog bound
is exact for one producer and may be overshot by one group per additional concurrent producer.

Durability is the Redis server's setting (see pqrl.redis_server): with ``appendfsync always`` a
restart loses no acknowledged write; the default ``everysec`` can lose about the last second.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
import redis.exceptions

from pqrl.codec import CodecError, decode_many, encode_many
from pqrl.trajectory import Trajectory

__all__ = [
    "Backpressure",
    "GroupEntry",
    "PolicyState",
    "SamplerClaim",
    "SamplerState",
    "StoreError",
    "StoreUnavailable",
    "TaskEntry",
    "TrajectoryStore",
]

log = logging.getLogger(__name__)

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
class GroupEntry:
    """One finished group as read from the stream; ack ``entry_id`` once it is used."""

    entry_id: str
    trajectories: list[Trajectory]
    delivery_count: int = 1


@dataclass(frozen=True, slots=True)
class TaskEntry:
    entry_id: str
    task: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PolicyState:
    version: int
    weights: str | None


@dataclass(frozen=True, slots=True)
class SamplerState:
    """The run's task-sampler config (opaque JSON text; None when the run has none) and position."""

    config: str | None
    position: int


@dataclass(frozen=True, slots=True)
class SamplerClaim:
    """What ``claim_task`` did: ``entry`` is the lease it delivered (None when the position had moved
    on, nothing written), ``position`` the sampler position after the call."""

    entry: TaskEntry | None
    position: int


# Entries are delivered to groups in id order, so everything at or below a group's last-delivered
# id that is not pending has been acked by it. The trim bound is the minimum over groups of
# (oldest pending id) or (last delivered id + 1); no groups, no trim.
_LUA_TRIM = """
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function trim_acked(key)
  if redis.call('EXISTS', key) == 0 then return 0 end
  local groups = redis.call('XINFO', 'GROUPS', key)
  if #groups == 0 then return 0 end
  local best_ms, best_seq
  for _, g in ipairs(groups) do
    local info = {}
    for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
    local ms, seq
    if info['pending'] > 0 then
      ms, seq = parse(redis.call('XPENDING', key, info['name'])[2])
    else
      ms, seq = parse(info['last-delivered-id'])
      seq = seq + 1
    end
    if best_ms == nil or ms < best_ms or (ms == best_ms and seq < best_seq) then
      best_ms, best_seq = ms, seq
    end
  end
  return redis.call('XTRIM', key, 'MINID', string.format('%d-%d', best_ms, best_seq))
end
"""

_LUA_ACK = (
    _LUA_TRIM
    + """
local acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
return {acked, trim_acked(KEYS[1])}
"""
)

_LUA_TRIM_ONLY = _LUA_TRIM + "\nreturn trim_acked(KEYS[1])\n"

# A batch of tasks is queued at most once per run: resubmitting the same suite is a no-op.
_LUA_PUSH_ONCE = """
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return -1 end
for i = 2, #ARGV do redis.call('XADD', KEYS[1], '*', 'task', ARGV[i]) end
return #ARGV - 1
"""

# The staleness gate (DESIGN.md section 2, AReaL): admit a group only while
#   running < max_concurrent and accepted + running < (max_staleness + version + 1) * groups_per_step.
# One script, so several rollout managers sharing a run never over-admit.
_LUA_ADMIT = """
local version = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
local accepted = tonumber(redis.call('HGET', KEYS[1], 'accepted') or '0')
local running = tonumber(redis.call('HGET', KEYS[1], 'running') or '0')
local max_concurrent, max_staleness, per_step = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local budget = (max_staleness + version + 1) * per_step - (accepted + running)
local capacity = math.min(max_concurrent - running, budget)
if capacity <= 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'running', 1)
return 1
"""

# The sampler's config is set once per run; setting the same one again (a resumed run) is a no-op.
_LUA_SAMPLER_SET = """
local cur = redis.call('HGET', KEYS[1], 'config')
if cur and cur ~= ARGV[1] then return redis.error_reply('the run has another task sampler: ' .. cur) end
redis.call('HSETNX', KEYS[1], 'position', 0)
if cur then return 0 end
redis.call('HSET', KEYS[1], 'config', ARGV[1])
return 1
"""

# Claiming slot k of the sampler: advancing the position, queueing the task and leasing it to the
# caller are one step, so no slot is handed out twice (the position is compared first) and none is
# lost (a caller that dies after this leaves a pending lease that reclaim_tasks hands on).
# XREADGROUP '>' delivers the oldest undelivered entry: a task submitted explicitly goes first and
# the slot's task waits in the queue for the next taker.
_LUA_CLAIM = """
local pos = tonumber(redis.call('HGET', KEYS[1], 'position') or '0')
if pos ~= tonumber(ARGV[1]) then return {pos} end
redis.call('HSET', KEYS[1], 'position', pos + 1)
redis.call('XADD', KEYS[2], '*', 'task', ARGV[2])
local got = redis.call('XREADGROUP', 'GROUP', ARGV[3], ARGV[4], 'COUNT', 1, 'STREAMS', KEYS[2], '>')
local e = got[1][2][1]
return {pos + 1, e[1], e[2][2]}
"""

# Versions only grow: a resumed trainer must publish above everything engines have seen.
_LUA_PUBLISH = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
local v = tonumber(ARGV[1])
if v < 0 then v = cur + 1 end
if v <= cur and redis.call('HEXISTS', KEYS[1], 'version') == 1 then
  return redis.error_reply('policy version ' .. v .. ' is not above the current ' .. cur)
end
redis.call('HSET', KEYS[1], 'version', v, 'weights', ARGV[2], 'updated', ARGV[3])
return v
"""


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _redis_errors(
    fn: Callable[P, Awaitable[R]],
) -> Callable[P, Awaitable[R]]:
    """Turns connection failures into StoreUnavailable naming the URL."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        self = args[0]
        try:
            return await fn(*args, **kwargs)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as e:
            raise StoreUnavailable(f"cannot reach Redis at {self.url_redacted}: {e}") from e  # type: ignore[attr-defined]

    return wrapper


def _decode_str(b: bytes | str) -> str:
    return b.decode() if isinstance(b, bytes) else b


class TrajectoryStore:
    """Async access to one run's groups, tasks and policy version in Redis.

    Args:
        url: Redis URL, e.g. ``redis://127.0.0.1:6379/0``.
        run_id: the run whose keys this store reads and writes.
        max_backlog: the most groups the stream holds before ``put_group`` reports back-pressure;
            0 means unbounded.
    """

    def __init__(self, url: str, run_id: str, *, max_backlog: int = 1024) -> None:
        if not run_id or any(c in run_id for c in "{}: \t\n"):
            raise ValueError(f"run_id must be non-empty without braces, colons or spaces: {run_id!r}")
        if max_backlog < 0:
            raise ValueError(f"max_backlog must be >= 0, got {max_backlog}")
        self.url_redacted = _redacted(url)
        self.run_id = run_id
        self.max_backlog = max_backlog
        self.redis = aioredis.Redis.from_url(url, decode_responses=False, socket_connect_timeout=5)
        prefix = f"pqrl:{{{run_id}}}"
        self.groups_key = f"{prefix}:groups"
        self.dead_key = f"{prefix}:dead"
        self.tasks_key = f"{prefix}:tasks"
        self.policy_key = f"{prefix}:policy"
        self.status_key = f"{prefix}:status"
        self._backlog_hint = 0  # XLEN as last seen by this producer; trims only lower the truth
        self._ack = self.redis.register_script(_LUA_ACK)
        self._trim = self.redis.register_script(_LUA_TRIM_ONLY)
        self._publish = self.redis.register_script(_LUA_PUBLISH)
        self._push_once = self.redis.register_script(_LUA_PUSH_ONCE)
        self.batches_key = f"{prefix}:task-batches"
        self.gate_key = f"{prefix}:gate"
        self._admit = self.redis.register_script(_LUA_ADMIT)
        self.sampler_key = f"{prefix}:sampler"
        self._sampler_set = self.redis.register_script(_LUA_SAMPLER_SET)
        self._claim = self.redis.register_script(_LUA_CLAIM)

    async def __aenter__(self) -> TrajectoryStore:
        await self.ping()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.redis.aclose()

    @_redis_errors
    async def ping(self) -> None:
        await self.redis.ping()

    # ---------------------------------------------------------------- producers

    async def try_put_group(self, trajectories: Sequence[Trajectory]) -> str | None:
        """Appends one finished group; returns its entry id, or None when the backlog is full."""
        entry_id, _ = await self._try_add(trajectories)
        return entry_id

    async def put_group(self, trajectories: Sequence[Trajectory], *, timeout: float = 0.0) -> str:
        """Appends one finished group, waiting up to ``timeout`` seconds for backlog space.

        Raises:
            Backpressure: the backlog stayed full for ``timeout`` seconds (at once when 0).
        """
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            entry_id, backlog = await self._try_add(trajectories)
            if entry_id is not None:
                return entry_id
            if time.monotonic() + delay > deadline:
                raise Backpressure(backlog, self.max_backlog)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    @_redis_errors
    async def _try_add(self, trajectories: Sequence[Trajectory]) -> tuple[str | None, int]:
        # No Lua here: passing ~0.5 MB of blobs through a script costs more than the add itself.
        # Look before adding only when the last length seen leaves no room, so the bound is exact
        # for one producer and overshoots by at most one group per other concurrent producer.
        fields = self._group_fields(trajectories)
        if self.max_backlog and self._backlog_hint + 1 >= self.max_backlog:
            self._backlog_hint = int(await self.redis.xlen(self.groups_key))
            if self._backlog_hint >= self.max_backlog:
                return None, self._backlog_hint
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(self.groups_key, fields)
            pipe.xlen(self.groups_key)
            entry_id, backlog = await pipe.execute()
        self._backlog_hint = int(backlog)
        return _decode_str(entry_id), self._backlog_hint

    def _group_fields(self, trajectories: Sequence[Trajectory]) -> dict[str, bytes]:
        if not trajectories:
            raise ValueError("a group needs at least one trajectory")
        for i, t in enumerate(trajectories):
            if not isinstance(t, Trajectory):
                raise TypeError(f"group member {i} is {type(t).__name__}, not Trajectory")
        group_id = trajectories[0].group_id
        for t in trajectories:
            if t.run_id != self.run_id:
                raise ValueError(f"trajectory {t.id} belongs to run {t.run_id!r}, not {self.run_id!r}")
            if t.group_id != group_id:
                raise ValueError(f"trajectory {t.id} has group_id {t.group_id!r}, expected {group_id!r}")
        return {"group": encode_many(trajectories)}

    @_redis_errors
    async def backlog(self) -> int:
        """Groups in the stream that some consumer group has not acknowledged (or not read)."""
        return int(await self.redis.xlen(self.groups_key))

    # ---------------------------------------------------------------- consumers

    @_redis_errors
    async def create_consumer_group(self, group: str, *, from_start: bool = True) -> None:
        """Creates ``group`` (idempotent). ``from_start`` also delivers entries already queued."""
        await _create_group(self.redis, self.groups_key, group, from_start)

    @_redis_errors
    async def read_groups(
        self, group: str, consumer: str, *, count: int = 1, block_ms: int | None = None
    ) -> list[GroupEntry]:
        """Delivers up to ``count`` new groups to ``consumer``; each must be acked once used.

        Entries that fail to decode are moved to the dead-letter stream with the reason (nothing
        is dropped), acknowledged, logged, and left out of the result.
        """
        reply = await self.redis.xreadgroup(
            group, consumer, {self.groups_key: ">"}, count=count, block=block_ms
        )
        raw = reply[0][1] if reply else []
        return await self._decode_entries(group, raw)

    @_redis_errors
    async def read_own_pending(self, group: str, consumer: str, *, count: int = 100) -> list[GroupEntry]:
        """Groups delivered to ``consumer`` before and never acknowledged, oldest first.

        A restarted trainer (same consumer name) reads these first: the groups it had taken but not
        yet covered by a checkpoint when it stopped.
        """
        reply = await self.redis.xreadgroup(group, consumer, {self.groups_key: "0"}, count=count)
        raw = [(i, f) for i, f in (reply[0][1] if reply else []) if f]
        return await self._decode_entries(group, raw)

    @_redis_errors
    async def ack(self, group: str, entry_ids: Iterable[str]) -> int:
        """Acknowledges entries for ``group`` and trims what every group has acknowledged."""
        return await self._ack_and_trim(self.groups_key, group, entry_ids)

    async def _ack_and_trim(self, key: str, group: str, entry_ids: Iterable[str]) -> int:
        ids = list(entry_ids)
        if not ids:
            return 0
        acked, _ = await self._ack(keys=[key], args=[group, *ids])
        return int(acked)

    @_redis_errors
    async def reclaim(
        self, group: str, consumer: str, *, min_idle_ms: int, count: int = 100
    ) -> list[GroupEntry]:
        """Takes over groups that another consumer of ``group`` read but did not ack in time."""
        raw = await _autoclaim(self.redis, self.groups_key, group, consumer, min_idle_ms, count)
        entries = await self._decode_entries(group, raw)
        if not entries:
            return entries
        counts = await self._delivery_counts(group, [e.entry_id for e in entries])
        return [GroupEntry(e.entry_id, e.trajectories, counts.get(e.entry_id, 1)) for e in entries]

    @_redis_errors
    async def trim_acknowledged(self) -> int:
        """Trims the prefix every consumer group has acknowledged; returns entries removed."""
        return int(await self._trim(keys=[self.groups_key]))

    @_redis_errors
    async def pending(self, group: str) -> int:
        """Groups delivered to ``group`` but not yet acknowledged."""
        return int((await self.redis.xpending(self.groups_key, group))["pending"])

    @_redis_errors
    async def peek_groups(self, count: int) -> list[tuple[str, list[Trajectory] | CodecError]]:
        """The ``count`` most recent groups, oldest first, without consuming them (inspection).

        A corrupt entry comes back as its CodecError and stays where it is.
        """
        out: list[tuple[str, list[Trajectory] | CodecError]] = []
        for entry_id, fields in reversed(await self.redis.xrevrange(self.groups_key, count=count)):
            try:
                out.append((_decode_str(entry_id), _decode_group(fields)))
            except CodecError as e:
                out.append((_decode_str(entry_id), e))
        return out

    @_redis_errors
    async def dead_letters(self) -> list[tuple[str, str]]:
        """(original entry id, reason) of every entry that failed to decode."""
        rows = await self.redis.xrange(self.dead_key)
        return [(_decode_str(f[b"source_id"]), _decode_str(f[b"reason"])) for _, f in rows]

    async def _decode_entries(self, group: str, raw: list[Any]) -> list[GroupEntry]:
        out: list[GroupEntry] = []
        for entry_id, fields in raw:
            eid = _decode_str(entry_id)
            try:
                out.append(GroupEntry(eid, _decode_group(fields)))
            except CodecError as e:
                await self._dead_letter(group, eid, fields, str(e))
        return out

    async def _dead_letter(self, group: str, entry_id: str, fields: dict[bytes, bytes], reason: str) -> None:
        log.error(
            "run %s: group entry %s is corrupt, moved to %s: %s", self.run_id, entry_id, self.dead_key, reason
        )
        payload: dict[Any, Any] = {"source_id": entry_id, "group": group, "reason": reason}
        payload.update({b"field:" + k: v for k, v in fields.items()})
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.dead_key, payload)
            pipe.xack(self.groups_key, group, entry_id)
            await pipe.execute()
        await self._trim(keys=[self.groups_key])

    async def _delivery_counts(self, group: str, ids: list[str]) -> dict[str, int]:
        rows = await self.redis.xpending_range(
            self.groups_key, group, min=ids[0], max=ids[-1], count=len(ids)
        )
        return {_decode_str(r["message_id"]): int(r["times_delivered"]) for r in rows}

    # ---------------------------------------------------------------- policy version

    @_redis_errors
    async def get_policy(self) -> PolicyState:
        """The current policy version (0 before any publication) and where its weights are."""
        h = await self.redis.hgetall(self.policy_key)
        weights = h.get(b"weights")
        return PolicyState(int(h.get(b"version", 0)), _decode_str(weights) if weights else None)

    @_redis_errors
    async def publish_policy(self, weights: str, *, version: int | None = None) -> int:
        """Records new weights as the current policy; returns the new version.

        ``version=None`` takes the next one. An explicit version must exceed the current one.
        """
        if version is not None and version < 0:
            raise ValueError(f"policy version must be >= 0, got {version}")
        try:
            v = await self._publish(
                keys=[self.policy_key], args=[-1 if version is None else version, weights, time.time()]
            )
        except redis.exceptions.ResponseError as e:
            raise StoreError(str(e)) from None
        return int(v)

    @_redis_errors
    async def set_status(self, fields: dict[str, Any]) -> None:
        """The trainer's latest figures for ``pqrl status`` (values JSON-encoded)."""
        await self.redis.hset(self.status_key, mapping={k: json.dumps(v) for k, v in fields.items()})

    @_redis_errors
    async def get_status(self) -> dict[str, Any]:
        raw = await self.redis.hgetall(self.status_key)
        return {_decode_str(k): json.loads(v) for k, v in raw.items()}

    # ---------------------------------------------------------------- staleness gate

    @_redis_errors
    async def gate_admit(self, *, max_concurrent: int, max_staleness: int, groups_per_step: int) -> bool:
        """Reserves room for one more group in flight if the staleness budget allows (atomic)."""
        args = [max_concurrent, max_staleness, groups_per_step]
        return bool(await self._admit(keys=[self.gate_key, self.policy_key], args=args))

    @_redis_errors
    async def gate_finish(self, *, accepted: bool) -> None:
        """A group admitted by ``gate_admit`` ended: written to the stream, or dropped (rejected)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(self.gate_key, "running", -1)
            pipe.hincrby(self.gate_key, "accepted" if accepted else "rejected", 1)
            await pipe.execute()

    @_redis_errors
    async def gate_release(self) -> None:
        """Returns a place reserved by ``gate_admit`` that was not used (no task to run)."""
        await self.redis.hincrby(self.gate_key, "running", -1)

    @_redis_errors
    async def gate_reject(self, n: int = 1) -> None:
        """The trainer dropped ``n`` accepted groups (stale, no signal): they free capacity."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(self.gate_key, "accepted", -n)
            pipe.hincrby(self.gate_key, "rejected", n)
            await pipe.execute()

    @_redis_errors
    async def gate_reset(self, *, groups_per_step: int) -> None:
        """On resume: ``accepted`` restarts at ``version * groups_per_step``, nothing running."""
        version = (await self.get_policy()).version
        await self.redis.hset(self.gate_key, mapping={"accepted": version * groups_per_step, "running": 0})

    @_redis_errors
    async def gate_state(self) -> dict[str, int]:
        raw = await self.redis.hgetall(self.gate_key)
        state = {k.decode(): int(v) for k, v in raw.items()}
        return {"accepted": state.get("accepted", 0), "running": state.get("running", 0),
                "rejected": state.get("rejected", 0)}  # fmt: skip

    # ---------------------------------------------------------------- task queue

    @_redis_errors
    async def push_tasks(self, tasks: Iterable[dict[str, Any]]) -> list[str]:
        """Queues task specs (JSON-serializable dicts) for the run's rollout workers."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for task in tasks:
                pipe.xadd(self.tasks_key, {"task": json.dumps(task, separators=(",", ":"))})
            ids = await pipe.execute()
        return [_decode_str(i) for i in ids]

    @_redis_errors
    async def push_tasks_once(self, batch_id: str, tasks: Iterable[dict[str, Any]]) -> int | None:
        """Queues ``tasks`` unless a batch with this id was queued before in this run (atomic).

        Returns the number queued, or None when the batch was already there.
        """
        payload = [json.dumps(t, separators=(",", ":")) for t in tasks]
        n = int(await self._push_once(keys=[self.tasks_key, self.batches_key], args=[batch_id, *payload]))
        return None if n < 0 else n

    @_redis_errors
    async def take_tasks(
        self, group: str, consumer: str, *, count: int = 1, block_ms: int | None = None
    ) -> list[TaskEntry]:
        """Delivers queued tasks to one rollout worker; ack them with ``ack_tasks`` when done."""
        await _create_group(self.redis, self.tasks_key, group, True)
        reply = await self.redis.xreadgroup(
            group, consumer, {self.tasks_key: ">"}, count=count, block=block_ms
        )
        return [TaskEntry(_decode_str(i), json.loads(f[b"task"])) for i, f in (reply[0][1] if reply else [])]

    @_redis_errors
    async def ack_tasks(self, group: str, entry_ids: Iterable[str]) -> int:
        return await self._ack_and_trim(self.tasks_key, group, entry_ids)

    @_redis_errors
    async def requeue_pending_tasks(self, group: str) -> int:
        """Puts every task leased by ``group`` and not acknowledged back on the queue (atomic).

        Only for when no consumer of ``group`` is alive (an embedded job resuming): a live manager's
        leases would be run twice.
        """
        await _create_group(self.redis, self.tasks_key, group, True)
        return int(await self.redis.eval(_LUA_REQUEUE, 1, self.tasks_key, group))

    @_redis_errors
    async def reclaim_tasks(
        self, group: str, consumer: str, *, min_idle_ms: int, count: int = 100
    ) -> list[TaskEntry]:
        await _create_group(self.redis, self.tasks_key, group, True)
        raw = await _autoclaim(self.redis, self.tasks_key, group, consumer, min_idle_ms, count)
        return [TaskEntry(_decode_str(i), json.loads(f[b"task"])) for i, f in raw]

    # ---------------------------------------------------------------- task sampler

    @_redis_errors
    async def set_sampler(self, config: str) -> bool:
        """Gives the run its task-sampler config (position 0); False when it had this one already.

        Raises:
            StoreError: the run has a different sampler config.
        """
        try:
            return bool(await self._sampler_set(keys=[self.sampler_key], args=[config]))
        except redis.exceptions.ResponseError as e:
            raise StoreError(str(e)) from None

    @_redis_errors
    async def get_sampler(self) -> SamplerState:
        config, position = await self.redis.hmget(self.sampler_key, ["config", "position"])
        return SamplerState(_decode_str(config) if config else None, int(position or 0))

    @_redis_errors
    async def sampler_position(self) -> int:
        """The next slot the sampler hands out: the number claimed so far (checkpoints save it)."""
        return int(await self.redis.hget(self.sampler_key, "position") or 0)

    @_redis_errors
    async def set_sampler_position(self, position: int) -> None:
        """Resume: the next claim takes slot ``position``. Slots already queued are not removed."""
        if position < 0:
            raise ValueError(f"sampler position must be >= 0, got {position}")
        await self.redis.hset(self.sampler_key, "position", position)

    @_redis_errors
    async def claim_task(
        self, group: str, consumer: str, *, position: int, task: dict[str, Any]
    ) -> SamplerClaim:
        """Queues ``task`` as sampler slot ``position`` and leases the oldest undelivered task to
        ``consumer``, only if ``position`` is still the sampler's next slot (atomic)."""
        await _create_group(self.redis, self.tasks_key, group, True)
        payload = json.dumps(task, separators=(",", ":"))
        reply = await self._claim(
            keys=[self.sampler_key, self.tasks_key], args=[position, payload, group, consumer]
        )
        if len(reply) == 1:
            return SamplerClaim(None, int(reply[0]))
        return SamplerClaim(TaskEntry(_decode_str(reply[1]), json.loads(reply[2])), int(reply[0]))


_LUA_REQUEUE = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 100000)
local n = 0
for _, p in ipairs(pending) do
  local e = redis.call('XRANGE', KEYS[1], p[1], p[1])
  if #e > 0 then
    redis.call('XADD', KEYS[1], '*', unpack(e[1][2]))
    n = n + 1
  end
  redis.call('XACK', KEYS[1], ARGV[1], p[1])
end
return n
"""


def _decode_group(fields: dict[bytes, bytes]) -> list[Trajectory]:
    if list(fields) != [b"group"]:
        raise CodecError(f"group entry has fields {sorted(fields)}, expected only b'group'")
    group = decode_many(fields[b"group"])
    if not group:
        raise CodecError("group entry holds no trajectories")
    return group


async def _create_group(r: aioredis.Redis, key: str, group: str, from_start: bool) -> None:
    try:
        await r.xgroup_create(key, group, id="0" if from_start else "$", mkstream=True)
    except redis.exceptions.ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise


async def _autoclaim(
    r: aioredis.Redis, key: str, group: str, consumer: str, min_idle_ms: int, count: int
) -> list[Any]:
    out: list[Any] = []
    start = "0-0"
    while len(out) < count:
        reply = await r.xautoclaim(key, group, consumer, min_idle_ms, start_id=start, count=count - len(out))
        start = _decode_str(reply[0])
        out += [(i, f) for i, f in reply[1] if f is not None]
        if start == "0-0":
            break
    return out
