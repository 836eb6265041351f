"""The run's policy version and where its weights are; versions only grow."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis.asyncio as aioredis
import redis.exceptions

from pqrl.store.connection import RunKeys, RunPart, StoreError, decode_str, redis_errors

__all__ = ["PolicyState", "PolicyVersion"]

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


@dataclass(frozen=True, slots=True)
class PolicyState:
    """The current policy version and where its weights are (None before any publication)."""

    version: int
    weights: str | None


class PolicyVersion(RunPart):
    """The hash ``keys.policy``: ``version``, ``weights``, ``updated``."""

    def __init__(self, redis: aioredis.Redis, keys: RunKeys, url_redacted: str) -> None:
        super().__init__(redis, keys, url_redacted)
        self._publish = redis.register_script(_LUA_PUBLISH)

    @redis_errors
    async def get(self) -> PolicyState:
        """The current policy version (0 before any publication) and where its weights are."""
        h = await self.redis.hgetall(self.keys.policy)
        weights = h.get(b"weights")
        return PolicyState(int(h.get(b"version", 0)), decode_str(weights) if weights else None)

    @redis_errors
    async def publish(self, weights: str, *, version: int | None = None) -> int:
        """Records new weights as the current policy; returns the new version (atomic).

        ``version=None`` takes the next one. An explicit version must exceed the current one.

        Raises:
            StoreError: ``version`` is not above the current one.
        """
        if version is not None and version < 0:
            raise ValueError(f"policy version must be >= 0, got {version}")
        try:
            v = await self._publish(
                keys=[self.keys.policy], args=[-1 if version is None else version, weights, time.time()]
            )
        except redis.exceptions.ResponseError as e:
            raise StoreError(str(e)) from None
        return int(v)
