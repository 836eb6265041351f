"""The run's task-sampler cursor: the sampler's config and the next slot it hands out.

The config is opaque JSON here (tasks.sampler reads it); the position is the only state. Claiming a
slot advances the position, queues the slot's task and leases a task in one Lua script.
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

__all__ = ["SamplerClaim", "SamplerCursor", "SamplerState"]

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
        self._claim = redis.register_script(_LUA_CLAIM)

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
