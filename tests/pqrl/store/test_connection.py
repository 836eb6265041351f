"""The shared connection: an unreachable Redis is named, a restarted one is picked up again, and
with ``appendfsync always`` a SIGKILLed Redis loses no acknowledged write of any part."""

from __future__ import annotations

import asyncio

import pytest

from pqrl.redis_server import RedisServer, free_port
from pqrl.store import StoreUnavailable, TrajectoryStore
from tests.conftest import make_group


async def test_restart_with_fsync_always_loses_no_acknowledged_write(redis_server):
    url = redis_server.url
    async with TrajectoryStore(url, "run1") as store:
        await store.groups.create_consumer_group("trainer")
        ids = [await store.groups.put(make_group(f"g{i}")) for i in range(4)]
        first = await store.groups.read("trainer", "t0", count=2)
        await store.groups.ack("trainer", [first[0].entry_id])  # g0 acked, g1 pending, g2/g3 unread
        await store.policy.publish("/ckpt/step-7", version=7)
        await store.tasks.push([{"id": "task-1"}])
    redis_server.kill()  # SIGKILL: no shutdown save, only what was fsynced survives
    restarted = RedisServer(
        port=redis_server.port, data_dir=redis_server.data_dir, appendfsync="always"
    ).start()
    try:
        async with TrajectoryStore(url, "run1") as store:
            assert (await store.policy.get()).version == 7
            assert (await store.policy.get()).weights == "/ckpt/step-7"
            assert await store.groups.pending("trainer") == 1
            assert await store.groups.backlog() == 3
            await asyncio.sleep(0.05)
            (pending,) = await store.groups.reclaim("trainer", "t1", min_idle_ms=1)
            assert pending.entry_id == ids[1] and pending.trajectories == make_group("g1")
            unread = await store.groups.read("trainer", "t0", count=10)
            assert [e.entry_id for e in unread] == ids[2:]
            assert [t.task for t in await store.tasks.take("rollout", "w")] == [{"id": "task-1"}]
    finally:
        restarted.stop()


async def test_unreachable_redis_names_the_url():
    port = free_port()
    store = TrajectoryStore(f"redis://:secret@127.0.0.1:{port}/0", "run1")
    with pytest.raises(StoreUnavailable) as err:
        await store.groups.put(make_group())
    assert f"127.0.0.1:{port}" in str(err.value) and "secret" not in str(err.value)
    with pytest.raises(StoreUnavailable):
        await store.groups.read("trainer", "t0")
    await store.close()


async def test_store_recovers_when_redis_comes_back(redis_server):
    async with TrajectoryStore(redis_server.url, "run1") as store:
        await store.groups.create_consumer_group("trainer")
        first = await store.groups.put(make_group("g0"))
        redis_server.kill()
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{redis_server.port}"):
            await store.groups.put(make_group("g1"))
        back = RedisServer(
            port=redis_server.port, data_dir=redis_server.data_dir, appendfsync="always"
        ).start()
        try:
            second = await store.groups.put(make_group("g1"))  # the same client reconnects
            entries = await store.groups.read("trainer", "t0", count=10)
            assert [e.entry_id for e in entries] == [first, second]
        finally:
            back.stop()
