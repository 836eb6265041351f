"""The staleness gate: how many groups the run's rollout managers may start (AReaL's admission rule).

A group is admitted only while ``running < max_concurrent`` and
``accepted + running < (max_staleness + version + 1) * groups_per_step``, so no sample lags the
policy by more than ``max_staleness`` versions on admission. The counters live in Redis, shared by
every manager of the run, and admission is one Lua script so several managers never over-admit.

``running`` is kept per holder (the manager that admitted the group), and a holder stays alive by
beating (``beat``; admitting beats too). The places of a holder that stopped beating for
``ttl_ms`` (a worker killed mid-group) are given back at the next admission, so a killed worker
cannot shrink the gate for good and stall the run.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from pqrl.store.connection import RunKeys, RunPart, redis_errors
from pqrl.store.policy import PolicyVersion

__all__ = ["HOLDER_TTL_MS", "AdmissionGate"]

HOLDER_TTL_MS = 30_000  # a holder silent this long is gone; managers beat several times per period

# KEYS: gate hash, policy hash, running hash (holder -> places). ARGV: max_concurrent,
# max_staleness, groups_per_step, holder, alive-key prefix, ttl_ms. Declared holders' alive keys are
# built here from the prefix: they share the run's hash slot, so this stays valid on a cluster.
_LIVE_RUNNING = """
local function live_running(running_key, prefix)
  local total, held = 0, redis.call('HGETALL', running_key)
  for i = 1, #held, 2 do
    if redis.call('EXISTS', prefix .. held[i]) == 1 then
      total = total + tonumber(held[i + 1])
    else
      redis.call('HDEL', running_key, held[i])  -- stopped beating: its groups will never end
    end
  end
  return total
end
"""

_LUA_ADMIT = (
    _LIVE_RUNNING
    + """
redis.call('SET', ARGV[5] .. ARGV[4], '1', 'PX', ARGV[6])
local version = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
local accepted = tonumber(redis.call('HGET', KEYS[1], 'accepted') or '0')
local running = live_running(KEYS[3], ARGV[5])
local max_concurrent, max_staleness, per_step = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local budget = (max_staleness + version + 1) * per_step - (accepted + running)
local capacity = math.min(max_concurrent - running, budget)
if capacity <= 0 then return 0 end
redis.call('HINCRBY', KEYS[3], ARGV[4], 1)
return 1
"""
)

# KEYS: gate hash, running hash. ARGV: holder, outcome field ('' for a place given back unused).
# A holder declared gone but still at work (stalled past its ttl) has no places left to give back.
_LUA_END = """
if tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') <= 0 then return 0 end
redis.call('HINCRBY', KEYS[2], ARGV[1], -1)
if ARGV[2] ~= '' then redis.call('HINCRBY', KEYS[1], ARGV[2], 1) end
return 1
"""

_LUA_STATE = (
    _LIVE_RUNNING
    + """
return {tonumber(redis.call('HGET', KEYS[1], 'accepted') or '0'), live_running(KEYS[2], ARGV[1]),
        tonumber(redis.call('HGET', KEYS[1], 'rejected') or '0')}
"""
)

# Other managers may be running groups (distributed mode): their places stay theirs, and what they
# already wrote stays counted; alone (embedded mode, its manager gone with the old process), start over.
_LUA_RESET = """
local floor = tonumber(redis.call('HGET', KEYS[2], 'version') or '0') * tonumber(ARGV[1])
if ARGV[2] == '1' then
  local accepted = tonumber(redis.call('HGET', KEYS[1], 'accepted') or '0')
  redis.call('HSET', KEYS[1], 'accepted', math.max(accepted, floor))
else
  redis.call('HSET', KEYS[1], 'accepted', floor)
  redis.call('DEL', KEYS[3])
end
return 1
"""


class AdmissionGate(RunPart):
    """The hash ``keys.gate`` (``accepted``, ``rejected``), the hash ``keys.gate_running`` (places
    per holder) and each holder's ``keys.alive(holder)``; reads the policy version."""

    def __init__(
        self, redis: aioredis.Redis, keys: RunKeys, url_redacted: str, *, policy: PolicyVersion
    ) -> None:
        super().__init__(redis, keys, url_redacted)
        self.policy = policy
        self._admit = redis.register_script(_LUA_ADMIT)
        self._end = redis.register_script(_LUA_END)
        self._state = redis.register_script(_LUA_STATE)
        self._reset = redis.register_script(_LUA_RESET)

    @redis_errors
    async def admit(
        self,
        *,
        holder: str,
        max_concurrent: int,
        max_staleness: int,
        groups_per_step: int,
        ttl_ms: int = HOLDER_TTL_MS,
    ) -> bool:
        """Reserves room for one more group of ``holder`` if the staleness budget allows (atomic)."""
        keys = [self.keys.gate, self.keys.policy, self.keys.gate_running]
        alive = self.keys.alive("")
        args: list[int | str] = [max_concurrent, max_staleness, groups_per_step, holder, alive, ttl_ms]
        return bool(await self._admit(keys=keys, args=args))

    @redis_errors
    async def beat(self, holder: str, *, ttl_ms: int = HOLDER_TTL_MS) -> None:
        """``holder`` is alive and its admitted groups still running, for ``ttl_ms`` more."""
        await self.redis.set(self.keys.alive(holder), b"1", px=ttl_ms)

    @redis_errors
    async def finish(self, *, holder: str, accepted: bool) -> None:
        """A group ``holder`` admitted ended: written to the stream, or dropped (rejected)."""
        outcome = "accepted" if accepted else "rejected"
        await self._end(keys=[self.keys.gate, self.keys.gate_running], args=[holder, outcome])

    @redis_errors
    async def release(self, *, holder: str) -> None:
        """Returns a place ``holder`` reserved with ``admit`` and did not use (no task to run)."""
        await self._end(keys=[self.keys.gate, self.keys.gate_running], args=[holder, ""])

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

        With ``live_managers`` (workers of a shared run may be mid-group) their places are kept, and
        ``accepted`` only rises to that floor: zeroing them would let the gate admit past the
        staleness bound while their groups are still to be written.
        """
        keys = [self.keys.gate, self.keys.policy, self.keys.gate_running]
        await self._reset(keys=keys, args=[groups_per_step, int(live_managers)])

    @redis_errors
    async def state(self) -> dict[str, int]:
        """``accepted``, ``running`` (of live holders) and ``rejected`` (0 when never set)."""
        accepted, running, rejected = await self._state(
            keys=[self.keys.gate, self.keys.gate_running], args=[self.keys.alive("")]
        )
        return {"accepted": int(accepted), "running": int(running), "rejected": int(rejected)}
