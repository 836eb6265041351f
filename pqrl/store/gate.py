"""The staleness gate: how many groups the run's rollout managers may start (AReaL's admission rule).

A group is admitted only while ``running < max_concurrent`` and
``accepted + running < (max_staleness + version + 1) * groups_per_step``, so no sample lags the
policy by more than ``max_staleness`` versions on admission. The counters live in Redis, shared by
every manager of the run, and admission is one Lua script so several managers never over-admit.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from pqrl.store.connection import RunKeys, RunPart, redis_errors
from pqrl.store.policy import PolicyVersion

__all__ = ["AdmissionGate"]

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


# Other managers may be running groups (distributed mode): their places stay theirs, and what they
# already wrote stays counted; alone (embedded mode, its manager gone with the old process), start over.
_LUA_RESET = """
local floor = tonumber(redis.call('HGET', KEYS[2], 'version') or '0') * tonumber(ARGV[1])
if ARGV[2] == '1' then
  local accepted = tonumber(redis.call('HGET', KEYS[1], 'accepted') or '0')
  redis.call('HSET', KEYS[1], 'accepted', math.max(accepted, floor))
else
  redis.call('HSET', KEYS[1], 'accepted', floor, 'running', 0)
end
return 1
"""


class AdmissionGate(RunPart):
    """The hash ``keys.gate``: ``accepted``, ``running`` and ``rejected`` groups; reads the policy."""

    def __init__(
        self, redis: aioredis.Redis, keys: RunKeys, url_redacted: str, *, policy: PolicyVersion
    ) -> None:
        super().__init__(redis, keys, url_redacted)
        self.policy = policy
        self._admit = redis.register_script(_LUA_ADMIT)
        self._reset = redis.register_script(_LUA_RESET)

    @redis_errors
    async def admit(self, *, max_concurrent: int, max_staleness: int, groups_per_step: int) -> bool:
        """Reserves room for one more group in flight if the staleness budget allows (atomic)."""
        args = [max_concurrent, max_staleness, groups_per_step]
        return bool(await self._admit(keys=[self.keys.gate, self.keys.policy], args=args))

    @redis_errors
    async def finish(self, *, accepted: bool) -> None:
        """A group admitted by ``admit`` ended: written to the stream, or dropped (rejected)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(self.keys.gate, "running", -1)
            pipe.hincrby(self.keys.gate, "accepted" if accepted else "rejected", 1)
            await pipe.execute()

    @redis_errors
    async def release(self) -> None:
        """Returns a place reserved by ``admit`` that was not used (no task to run)."""
        await self.redis.hincrby(self.keys.gate, "running", -1)

    @redis_errors
    async def reject(self, n: int = 1) -> None:
        """The trainer dropped ``n`` accepted groups (stale, no signal): they free capacity."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(self.keys.gate, "accepted", -n)
            pipe.hincrby(self.keys.gate, "rejected", n)
            await pipe.execute()

    @redis_errors
    async def reset(self, *, groups_per_step: int, live_managers: bool = False) -> None:
        """On a trainer's start: ``accepted`` restarts at ``version * groups_per_step``, nothing running.

        With ``live_managers`` (workers of a shared run may be mid-group) ``running`` is theirs and
        is kept, and ``accepted`` only rises to that floor: zeroing them would let the gate admit
        past the staleness bound and drive ``running`` below zero as their groups finish.
        """
        keys = [self.keys.gate, self.keys.policy]
        await self._reset(keys=keys, args=[groups_per_step, int(live_managers)])

    @redis_errors
    async def state(self) -> dict[str, int]:
        """The counters ``accepted``, ``running`` and ``rejected`` (0 when never set)."""
        raw = await self.redis.hgetall(self.keys.gate)
        state = {k.decode(): int(v) for k, v in raw.items()}
        return {"accepted": state.get("accepted", 0), "running": state.get("running", 0),
                "rejected": state.get("rejected", 0)}  # fmt: skip
