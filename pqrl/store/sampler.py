"""The run's task-sampler cursor: the sampler's config and the next slot it hands out.

The config is opaque JSON here (tasks.sampler reads it); the position is its state. Claiming a
slot advances the position, queues the slot's task and leases a task in one Lua script. For the
sampler's skipping of tasks without signal it also keeps each sampled task's recent outcome: the
groups in a row whose rewards were all equal, and the draws the task gave up since it last ran.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from pqrl.store._streams import create_consumer_group
from pqrl.store.connection import RunKeys, RunPart, StoreError, decode_str, redis_errors
from pqrl.store.tasks import TaskEntry, task_json

__all__ = ["SamplerClaim", "SamplerCursor", "SamplerState", "TaskOutcome"]

# The sampler's config is set once per run; setting the same one again (a resumed run) is a no-op.
_LUA_SAMPLER_SET = """
local cur = redis.call('HGET', KEYS[1], 'config')
if cur and cur ~= ARGV[1] then return redis.error_reply('the run has another task sampler: ' .. cur) end
redis.call('HSETNX', KEYS[1], 'position', 0)
if cur then return 0 end
redis.call('HSET', KEYS[1], 'config', ARGV[1])
return 1
"""

# Replacing the config the run has (compared first, so two resumers cannot both replace it).
_LUA_SAMPLER_REPLACE = """
local cur = redis.call('HGET', KEYS[1], 'config')
if cur ~= ARGV[1] then return redis.error_reply('the run has another task sampler: ' .. (cur or 'none')) end
redis.call('HSET', KEYS[1], 'config', ARGV[2])
return 1
"""

# Claiming slot k of the sampler: advancing the position, queueing the task and leasing it to the
# caller are one step, so no slot is handed out twice (the position is compared first) and none is
# lost (a caller that dies after this leaves a pending lease that TaskQueue.reclaim hands on).
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

# Skipping slot k: the position advances (if it is still k) and the task's skip count with it.
_LUA_SKIP = """
local pos = tonumber(redis.call('HGET', KEYS[1], 'position') or '0')
if pos ~= tonumber(ARGV[1]) then return pos end
redis.call('HSET', KEYS[1], 'position', pos + 1)
redis.call('HINCRBY', KEYS[2], ARGV[2] .. ':skipped', 1)
return pos + 1
"""


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """A sampled task's recent record: ``flat`` groups in a row carried no signal (every reward
    equal), and it gave up ``skipped`` sampler draws since it last ran."""

    flat: int = 0
    skipped: int = 0


@dataclass(frozen=True, slots=True)
class SamplerState:
    """The run's task-sampler config (opaque JSON text; None when the run has none) and position."""

    config: str | None
    position: int


@dataclass(frozen=True, slots=True)
class SamplerClaim:
    """What ``SamplerCursor.claim`` did: ``entry`` is the lease it delivered (None when the position
    had moved on, nothing written), ``position`` the sampler position after the call."""

    entry: TaskEntry | None
    position: int


class SamplerCursor(RunPart):
    """The hash ``keys.sampler``: ``config`` and ``position``; claims write to ``keys.tasks``."""

    def __init__(self, redis: aioredis.Redis, keys: RunKeys, url_redacted: str) -> None:
        super().__init__(redis, keys, url_redacted)
        self._configure = redis.register_script(_LUA_SAMPLER_SET)
        self._replace = redis.register_script(_LUA_SAMPLER_REPLACE)
        self._claim = redis.register_script(_LUA_CLAIM)
        self._skip = redis.register_script(_LUA_SKIP)

    @redis_errors
    async def configure(self, config: str) -> bool:
        """Gives the run its task-sampler config (position 0); False when it had this one already.

        Raises:
            StoreError: the run has a different sampler config.
        """
        try:
            return bool(await self._configure(keys=[self.keys.sampler], args=[config]))
        except redis.exceptions.ResponseError as e:
            raise StoreError(str(e)) from None

    @redis_errors
    async def replace(self, old: str, new: str) -> None:
        """Swaps the run's config ``old`` for ``new``, its position kept (a schedule that only grows).

        Raises:
            StoreError: the run's config is not ``old`` (any more).
        """
        try:
            await self._replace(keys=[self.keys.sampler], args=[old, new])
        except redis.exceptions.ResponseError as e:
            raise StoreError(str(e)) from None

    @redis_errors
    async def get(self) -> SamplerState:
        """The run's sampler config and position."""
        config, position = await self.redis.hmget(self.keys.sampler, ["config", "position"])
        return SamplerState(decode_str(config) if config else None, int(position or 0))

    @redis_errors
    async def position(self) -> int:
        """The next slot the sampler hands out: the number claimed so far (checkpoints save it)."""
        return int(await self.redis.hget(self.keys.sampler, "position") or 0)

    @redis_errors
    async def set_position(self, position: int) -> None:
        """Resume: the next claim takes slot ``position``. Slots already queued are not removed."""
        if position < 0:
            raise ValueError(f"sampler position must be >= 0, got {position}")
        await self.redis.hset(self.keys.sampler, "position", position)

    @redis_errors
    async def claim(
        self, consumer_group: str, consumer: str, *, position: int, task: dict[str, Any]
    ) -> SamplerClaim:
        """Queues ``task`` as sampler slot ``position`` and leases the oldest undelivered task to
        ``consumer``, only if ``position`` is still the sampler's next slot (atomic)."""
        await create_consumer_group(self.redis, self.keys.tasks, consumer_group, True)
        reply = await self._claim(
            keys=[self.keys.sampler, self.keys.tasks],
            args=[position, task_json(task), consumer_group, consumer],
        )
        if len(reply) == 1:
            return SamplerClaim(None, int(reply[0]))
        return SamplerClaim(TaskEntry(decode_str(reply[1]), json.loads(reply[2])), int(reply[0]))

    @redis_errors
    async def skip(self, *, position: int, task_key: str) -> int:
        """Passes over slot ``position`` without queueing its task, only if it is still the sampler's
        next slot, counting the skip against ``task_key`` (atomic); the position after the call."""
        return int(await self._skip(keys=[self.keys.sampler, self.keys.outcomes], args=[position, task_key]))

    @redis_errors
    async def outcome(self, task_key: str) -> TaskOutcome:
        fields = [f"{task_key}:flat", f"{task_key}:skipped"]
        flat, skipped = await self.redis.hmget(self.keys.outcomes, fields)
        return TaskOutcome(int(flat or 0), int(skipped or 0))

    @redis_errors
    async def record(self, task_key: str, *, signal: bool) -> None:
        """A group of ``task_key`` ran: with ``signal`` (rewards that differ) its flat run ends."""
        async with self.redis.pipeline(transaction=True) as pipe:
            if signal:
                pipe.hset(self.keys.outcomes, f"{task_key}:flat", 0)
            else:
                pipe.hincrby(self.keys.outcomes, f"{task_key}:flat", 1)
            pipe.hset(self.keys.outcomes, f"{task_key}:skipped", 0)
            await pipe.execute()
