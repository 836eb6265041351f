"""The run's task queue: a stream of JSON task specs leased to rollout workers by a consumer group.

A worker that dies leaves its leases pending; ``reclaim`` hands them to another after they have been
idle long enough. Acknowledging trims the stream as for the groups stream (pqrl.store._streams).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from pqrl.store._streams import AckAndTrim, autoclaim, create_consumer_group, read_new
from pqrl.store.connection import RunKeys, RunPart, decode_str, redis_errors

__all__ = ["TaskEntry", "TaskQueue"]

# A batch of tasks is queued at most once per run: resubmitting the same suite is a no-op.
_LUA_PUSH_ONCE = """
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return -1 end
for i = 2, #ARGV do redis.call('XADD', KEYS[1], '*', 'task', ARGV[i]) end
return #ARGV - 1
"""

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


@dataclass(frozen=True, slots=True)
class TaskEntry:
    """One leased task; ack ``entry_id`` once its group is written (or dropped)."""

    entry_id: str
    task: dict[str, Any]


def task_json(task: dict[str, Any]) -> str:
    """A task spec as the queue stores it (compact JSON)."""
    return json.dumps(task, separators=(",", ":"))


class TaskQueue(RunPart):
    """The stream ``keys.tasks``, with the set ``keys.task_batches`` of batches already queued."""

    def __init__(self, redis: aioredis.Redis, keys: RunKeys, url_redacted: str) -> None:
        super().__init__(redis, keys, url_redacted)
        self._streams = AckAndTrim(redis)
        self._push_once = redis.register_script(_LUA_PUSH_ONCE)

    @property
    def key(self) -> str:
        """The queue's stream key (e.g. for ``XLEN``)."""
        return self.keys.tasks

    @redis_errors
    async def push(self, tasks: Iterable[dict[str, Any]]) -> list[str]:
        """Queues task specs (JSON-serializable dicts) for the run's rollout workers."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for task in tasks:
                pipe.xadd(self.key, {"task": task_json(task)})
            ids = await pipe.execute()
        return [decode_str(i) for i in ids]

    @redis_errors
    async def push_once(self, batch_id: str, tasks: Iterable[dict[str, Any]]) -> int | None:
        """Queues ``tasks`` unless a batch with this id was queued before in this run (atomic).

        Returns the number queued, or None when the batch was already there.
        """
        payload = [task_json(t) for t in tasks]
        n = int(await self._push_once(keys=[self.key, self.keys.task_batches], args=[batch_id, *payload]))
        return None if n < 0 else n

    @redis_errors
    async def take(
        self, consumer_group: str, consumer: str, *, count: int = 1, block_ms: int | None = None
    ) -> list[TaskEntry]:
        """Delivers queued tasks to one rollout worker; ``ack`` them when done."""
        await create_consumer_group(self.redis, self.key, consumer_group, True)
        raw = await read_new(self.redis, self.key, consumer_group, consumer, count, block_ms)
        return [_entry(i, f) for i, f in raw]

    @redis_errors
    async def ack(self, consumer_group: str, entry_ids: Iterable[str]) -> int:
        """Acknowledges leases of ``consumer_group`` and trims what every consumer group has acked."""
        return await self._streams.ack(self.key, consumer_group, entry_ids)

    @redis_errors
    async def dead_letter(self, consumer_group: str, entry: TaskEntry, reason: str) -> None:
        """Moves leased ``entry`` to the run's dead tasks with ``reason``: the copy and the ack are one
        transaction, so the task is never both lost and acknowledged, nor run again."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.keys.dead_tasks, {"task": task_json(entry.task), "reason": reason})
            pipe.xack(self.key, consumer_group, entry.entry_id)
            await pipe.execute()
        await self._streams.trim(self.key)

    @redis_errors
    async def dead(self) -> list[tuple[dict[str, Any], str]]:
        """(task, reason) of every task dead-lettered in this run, oldest first."""
        rows = cast(list[tuple[bytes, dict[bytes, bytes]]], await self.redis.xrange(self.keys.dead_tasks))
        return [(json.loads(f[b"task"]), decode_str(f[b"reason"])) for _, f in rows]

    @redis_errors
    async def backlog(self) -> int:
        """Tasks in the queue's stream: zero only once every task queued has been leased and
        acknowledged (acks trim what no lease holds back; one older lease holds back newer tasks)."""
        return int(await self.redis.xlen(self.key))

    @redis_errors
    async def requeue_pending(self, consumer_group: str) -> int:
        """Puts every task leased by ``consumer_group`` and not acknowledged back on the queue (atomic).

        Only for when no consumer of ``consumer_group`` is alive (an embedded job resuming): a live
        manager's leases would be run twice.
        """
        await create_consumer_group(self.redis, self.key, consumer_group, True)
        return int(await self.redis.eval(_LUA_REQUEUE, 1, self.key, consumer_group))

    @redis_errors
    async def reclaim(
        self, consumer_group: str, consumer: str, *, min_idle_ms: int, count: int = 100
    ) -> list[TaskEntry]:
        """Takes over leases of ``consumer_group`` idle for ``min_idle_ms`` (their worker died)."""
        await create_consumer_group(self.redis, self.key, consumer_group, True)
        raw = await autoclaim(self.redis, self.key, consumer_group, consumer, min_idle_ms, count)
        return [_entry(i, f) for i, f in raw]


def _entry(entry_id: bytes | str, fields: dict[bytes, bytes]) -> TaskEntry:
    return TaskEntry(decode_str(entry_id), json.loads(fields[b"task"]))
