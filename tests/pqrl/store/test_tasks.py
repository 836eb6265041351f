"""The run's task queue: leases delivered once, reclaimed from dead workers, batches queued once."""

from __future__ import annotations

import asyncio


async def test_task_queue_delivers_once_and_reclaims(store):
    tasks = store.tasks
    ids = await tasks.push([{"id": f"t{i}", "q": "1+1"} for i in range(5)])
    a = await tasks.take("rollout", "w1", count=2)
    b = await tasks.take("rollout", "w2", count=10)
    assert [t.task["id"] for t in a + b] == [f"t{i}" for i in range(5)]
    await tasks.ack("rollout", [t.entry_id for t in b])
    await asyncio.sleep(0.05)
    again = await tasks.reclaim("rollout", "w3", min_idle_ms=10)  # w1 died
    assert [t.entry_id for t in again] == ids[:2]
    assert await tasks.backlog() > 0, "two leased and not acknowledged: not over"
    await tasks.ack("rollout", ids[:2])
    assert await store.redis.xlen(tasks.key) == 0 and await tasks.backlog() == 0


async def test_a_task_batch_is_queued_once_per_run(store):
    tasks = [{"id": f"t{i}"} for i in range(3)]
    assert await store.tasks.push_once("suite@abc", tasks) == 3
    assert await store.tasks.push_once("suite@abc", tasks) is None
    assert await store.tasks.push_once("suite@def", tasks[:1]) == 1
    got = await store.tasks.take("rollout", "w", count=10)
    assert [t.task["id"] for t in got] == ["t0", "t1", "t2", "t0"]
