"""The stream of finished groups against a real redis-server (tests/conftest.py starts one per test)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap

import pytest

from pqrl.store import Backpressure, TrajectoryStore
from tests.conftest import make_group


async def test_round_trip_and_ack_trims_the_stream(store):
    groups = store.groups
    await groups.create_consumer_group("trainer")
    sent = {f"g{i}": make_group(f"g{i}", size=3) for i in range(3)}
    ids = [await groups.put(g) for g in sent.values()]
    assert await groups.backlog() == 3
    entries = await groups.read("trainer", "t0", count=10)
    assert [e.entry_id for e in entries] == ids
    for e in entries:
        assert e.trajectories == sent[e.trajectories[0].group_id]
    assert await groups.pending("trainer") == 3
    assert await groups.ack("trainer", ids[:2]) == 2
    assert await groups.backlog() == 1  # the acked prefix is gone, the pending entry stays
    assert await groups.ack("trainer", ids[2:]) == 1
    assert await groups.backlog() == 0
    assert await groups.read("trainer", "t0", count=10) == []


async def test_groups_produced_and_undelivered_count_every_write(store):
    groups = store.groups
    assert await groups.produced() == 0 and not await groups.undelivered("trainer")
    await groups.create_consumer_group("trainer")
    ids = [await groups.put(make_group(f"g{i}", size=2)) for i in range(3)]
    assert await groups.undelivered("trainer")
    assert len(await groups.read("trainer", "t0", count=2)) == 2
    assert await groups.undelivered("trainer"), "one left to deliver"
    await groups.read("trainer", "t0", count=2)
    assert not await groups.undelivered("trainer"), "delivered, though not acknowledged"
    await groups.ack("trainer", ids)
    assert await groups.backlog() == 0 and await groups.produced() == 3, "trimmed groups still count"
    await groups.put(make_group("g3", size=2))
    assert await groups.undelivered("trainer") and await groups.produced() == 4


async def test_each_group_goes_to_exactly_one_consumer(store):
    groups = store.groups
    await groups.create_consumer_group("trainer")
    await groups.create_consumer_group("eval")
    ids = [await groups.put(make_group(f"g{i}", size=2)) for i in range(20)]

    async def consume(name: str) -> list[str]:
        got = []
        while entries := await groups.read("trainer", name, count=3):
            got += [e.entry_id for e in entries]
            await groups.ack("trainer", [e.entry_id for e in entries])
            await asyncio.sleep(0)  # let the other consumer in
        return got

    a, b = await asyncio.gather(consume("c1"), consume("c2"))
    assert a and b, "both consumers should have received work"
    assert sorted(a + b) == sorted(ids) and len(set(a + b)) == 20
    # Everything acked by "trainer", nothing by "eval": the data "eval" has not read is kept.
    assert await groups.backlog() == 20
    evals = await groups.read("eval", "e1", count=100)
    assert [e.entry_id for e in evals] == ids
    await groups.ack("eval", ids)
    assert await groups.backlog() == 0


async def test_unread_data_is_never_trimmed_without_consumer_groups(store):
    groups = store.groups
    for i in range(3):
        await groups.put(make_group(f"g{i}"))
    assert await groups.trim_acknowledged() == 0
    assert await groups.backlog() == 3
    await groups.create_consumer_group("late")  # a trainer that starts later still sees everything
    assert len(await groups.read("late", "t", count=10)) == 3


async def test_reclaim_after_a_consumer_process_dies(redis_server, store):
    groups = store.groups
    await groups.create_consumer_group("trainer")
    ids = [await groups.put(make_group(f"g{i}")) for i in range(3)]
    crashed = textwrap.dedent(f"""
        import asyncio, os
        from pqrl.store import TrajectoryStore
        async def main():
            s = TrajectoryStore({redis_server.url!r}, "run1")
            entries = await s.groups.read("trainer", "doomed", count=2)
            print(len(entries), flush=True)
            os._exit(0)  # dies holding two unacknowledged groups
        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", crashed], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "2", out.stderr
    assert await groups.pending("trainer") == 2
    assert await groups.reclaim("trainer", "rescuer", min_idle_ms=60_000) == []  # not idle long enough
    await asyncio.sleep(0.2)
    rescued = await groups.reclaim("trainer", "rescuer", min_idle_ms=100)
    assert [e.entry_id for e in rescued] == ids[:2]
    assert all(e.delivery_count == 2 for e in rescued)
    assert rescued[0].trajectories == make_group("g0")
    fresh = await groups.read("trainer", "rescuer", count=10)
    assert [e.entry_id for e in fresh] == ids[2:]
    await groups.ack("trainer", ids)
    assert await groups.pending("trainer") == 0 and await groups.backlog() == 0


async def test_backpressure_releases_as_the_trainer_consumes(redis_server):
    async with TrajectoryStore(redis_server.url, "run1", max_backlog=3) as store:
        groups = store.groups
        await groups.create_consumer_group("trainer")
        for i in range(3):
            assert await groups.try_put(make_group(f"g{i}")) is not None
        assert await groups.try_put(make_group("g3")) is None
        with pytest.raises(Backpressure) as err:
            await groups.put(make_group("g3"))
        assert err.value.backlog == 3 and err.value.limit == 3 and "backlog full" in str(err.value)

        waiting = asyncio.create_task(groups.put(make_group("g3"), timeout=20))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        (entry,) = await groups.read("trainer", "t0", count=1)
        assert not waiting.done(), "reading alone must not release space: the entry is not acked"
        await groups.ack("trainer", [entry.entry_id])
        new_id = await asyncio.wait_for(waiting, 10)
        assert await groups.backlog() == 3
        rest = await groups.read("trainer", "t0", count=10)
        assert [e.trajectories[0].group_id for e in rest] == ["g1", "g2", "g3"]
        assert rest[-1].entry_id == new_id


async def test_bad_groups_are_rejected_before_anything_is_written(store):
    groups = store.groups
    with pytest.raises(ValueError, match="at least one"):
        await groups.put([])
    with pytest.raises(ValueError, match="belongs to run 'other'"):
        await groups.put(make_group(run_id="other"))
    mixed = make_group("g1")[:2] + make_group("g2")[:1]
    with pytest.raises(ValueError, match="group_id 'g2'"):
        await groups.put(mixed)
    with pytest.raises(TypeError):
        await groups.put([{"tokens": [1, 2]}])
    assert await groups.backlog() == 0
    with pytest.raises(ValueError):
        TrajectoryStore("redis://127.0.0.1:1/0", "bad:run")


async def test_backlog_bound_with_two_producers_overshoots_by_at_most_one(redis_server):
    a = TrajectoryStore(redis_server.url, "run1", max_backlog=3)
    b = TrajectoryStore(redis_server.url, "run1", max_backlog=3)
    try:
        for i in range(3):
            assert await a.groups.try_put(make_group(f"a{i}")) is not None
        # b last saw an empty stream, so it adds without looking: one group over the bound ...
        assert await b.groups.try_put(make_group("b0")) is not None
        # ... and from then on both refuse until consumers make room.
        assert await b.groups.try_put(make_group("b1")) is None
        assert await a.groups.try_put(make_group("a3")) is None
        assert await a.groups.backlog() == 4
    finally:
        await a.close()
        await b.close()


async def test_peek_shows_recent_groups_without_consuming_them(store):
    groups = store.groups
    await groups.create_consumer_group("trainer")
    ids = [await groups.put(make_group(f"g{i}")) for i in range(3)]
    bad = (await store.redis.xadd(groups.key, {"group": b"junk"})).decode()
    peeked = await groups.peek(3)
    assert [e for e, _ in peeked] == [ids[1], ids[2], bad]
    assert peeked[0][1] == make_group("g1") and "shorter than the 8-byte prefix" in str(peeked[2][1])
    assert len(await groups.read("trainer", "t", count=10)) == 3, "nothing was consumed"
    assert await store.dead_letters.list() != []  # reading (not peeking) dead-letters the junk


async def test_a_blocking_read_raises_a_cancel_the_client_swallowed(store):
    """redis-py sometimes swallows a cancel that lands as a blocking read ends, leaving the task
    marked as cancelling; reproduced here as it happens there. The next read must raise it, or a
    loop polling the stream never stops."""
    await store.groups.create_consumer_group("trainer")
    await store.groups.put(make_group("g0", size=2))

    async def reads_after_a_swallowed_cancel(read):
        me = asyncio.current_task()
        me.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # no uncancel(), as the client does
            await asyncio.sleep(0)
        return await read()

    for read in (
        lambda: store.groups.read("trainer", "t0", count=1, block_ms=20),
        lambda: store.tasks.take("rollout", "w0", count=1, block_ms=20),
    ):
        with pytest.raises(asyncio.CancelledError):
            await asyncio.create_task(reads_after_a_swallowed_cancel(read))
    assert await store.groups.pending("trainer") == 1, "the group read stays pending: redelivered later"

    async def reads_plainly():
        return await store.groups.read("trainer", "t1", count=1, block_ms=20)

    assert await asyncio.create_task(reads_plainly()) == [], "a task never cancelled reads as before"
