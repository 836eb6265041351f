"""Consumer-group plumbing shared by the run's two streams (finished groups and tasks).

``XACK`` deletes nothing, so after each ack the stream is trimmed below the oldest entry that some
consumer group has not yet acknowledged (``XTRIM MINID``; Redis 7.0 has no ack-trimming of its own).
Acking with trimming is one Lua script, atomic when several producers and consumers share a run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import cast

import redis.asyncio as aioredis
import redis.exceptions

from pqrl.store.connection import decode_str

__all__ = ["AckAndTrim", "Entry", "autoclaim", "create_consumer_group", "read_new"]

# One stream entry as the store's clients get it: (id, {field: value}), all bytes. redis-py types its
# stream replies for every protocol and decoding choice at once (RESP3's maps included); the store
# speaks RESP2 without decoding, so the casts below name the one shape its replies take.
Entry = tuple[bytes, dict[bytes, bytes]]

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


class AckAndTrim:
    """The ack-and-trim and trim-only scripts, registered on one connection."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._ack = redis.register_script(_LUA_ACK)
        self._trim = redis.register_script(_LUA_TRIM_ONLY)

    async def ack(self, key: str, consumer_group: str, entry_ids: Iterable[str]) -> int:
        """Acknowledges entries of stream ``key`` for ``consumer_group``, then trims; returns acked."""
        ids = list(entry_ids)
        if not ids:
            return 0
        acked, _ = await self._ack(keys=[key], args=[consumer_group, *ids])
        return int(acked)

    async def trim(self, key: str) -> int:
        """Trims the prefix of ``key`` every consumer group has acknowledged; returns entries removed."""
        return int(await self._trim(keys=[key]))


async def read_new(
    r: aioredis.Redis, key: str, consumer_group: str, consumer: str, count: int, block_ms: int | None
) -> list[Entry]:
    """Up to ``count`` entries never delivered to ``consumer_group``, now delivered to ``consumer``;
    waits up to ``block_ms`` for the first (None: no wait).

    redis-py can swallow a cancel that lands as a blocking read ends (about 1 cancel in 50 near the
    block's end, measured): the command returns normally while the task is still marked as
    cancelling. The cancel is raised again here, or a caller polling in a loop would never stop."""
    reply = cast(
        list[tuple[bytes, list[Entry]]],
        await r.xreadgroup(consumer_group, consumer, {key: ">"}, count=count, block=block_ms),
    )
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("cancelled during a blocking read")  # its entries stay pending
    return reply[0][1] if reply else []


async def create_consumer_group(r: aioredis.Redis, key: str, consumer_group: str, from_start: bool) -> None:
    """Creates ``consumer_group`` on stream ``key`` (and the stream), doing nothing if it exists."""
    try:
        await r.xgroup_create(key, consumer_group, id="0" if from_start else "$", mkstream=True)
    except redis.exceptions.ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise


async def autoclaim(
    r: aioredis.Redis, key: str, consumer_group: str, consumer: str, min_idle_ms: int, count: int
) -> list[Entry]:
    """Up to ``count`` entries idle for ``min_idle_ms``, handed to ``consumer`` (``XAUTOCLAIM``).

    Entries deleted while pending (nil fields) are left out.
    """
    out: list[Entry] = []
    start = "0-0"
    while len(out) < count:
        reply = await r.xautoclaim(
            key, consumer_group, consumer, min_idle_ms, start_id=start, count=count - len(out)
        )
        start = decode_str(reply[0])
        out += [(i, f) for i, f in reply[1] if f is not None]
        if start == "0-0":
            break
    return out
