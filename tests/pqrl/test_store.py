"""The Redis trajectory store against a real redis-server (tests/conftest.py starts one per test)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from pqrl.redis_server import RedisServer, free_port
from pqrl.store import Backpressure, StoreError, StoreUnavailable, TrajectoryStore
from tests.conftest import make_group


async def test_round_trip_and_ack_trims_the_stream(store):
    await store.create_consumer_group("trainer")
    sent = {f"g{i}": make_group(f"g{i}", size=3) for i in range(3)}
    ids = [await store.put_group(g) for g in sent.values()]
    assert await store.backlog() == 3
    entries = await store.read_groups("trainer", "t0", count=10)
    assert [e.entry_id for e in entries] == ids
    for e in entries:
        assert e.trajectories == sent[e.trajectories[0].group_id]
    assert await store.pending("trainer") == 3
    assert await store.ack("trainer", ids[:2]) == 2
    assert await store.backlog() == 1  # the acked prefix is gone, the pending entry stays
    assert await store.ack("trainer", ids[2:]) == 1
    assert await store.backlog() == 0
    assert await store.read_groups("trainer", "t0", count=10) == []


async def test_each_group_goes_to_exactly_one_consumer(store):
    await store.create_consumer_group("trainer")
    await store.create_consumer_group("eval")
    ids = [await store.put_group(make_group(f"g{i}", size=2)) for i in range(20)]

    async def consume(name: str) -> list[str]:
        got = []
        while entries := await store.read_groups("trainer", name, count=3):
            got += [e.entry_id for e in entries]
            await store.ack("trainer", [e.entry_id for e in entries])
            await asyncio.sleep(0)  # let the other consumer in
        return got

    a, b = await asyncio.gather(consume("c1"), consume("c2"))
    assert a and b, "both consumers should have received work"
    assert sorted(a + b) == sorted(ids) and len(set(a + b)) == 20
    # Everything acked by "trainer", nothing by "eval": the data "eval" has not read is kept.
    assert await store.backlog() == 20
    evals = await store.read_groups("eval", "e1", count=100)
    assert [e.entry_id for e in evals] == ids
    await store.ack("eval", ids)
    assert await store.backlog() == 0


async def test_unread_data_is_never_trimmed_without_consumer_groups(store):
    for i in range(3):
        await store.put_group(make_group(f"g{i}"))
    assert await store.trim_acknowledged() == 0
    assert await store.backlog() == 3
    await store.create_consumer_group("late")  # a trainer that starts later still sees everything
    assert len(await store.read_groups("late", "t", count=10)) == 3


async def test_reclaim_after_a_consumer_process_dies(redis_server, store):
    await store.create_consumer_group("trainer")
    ids = [await store.put_group(make_group(f"g{i}")) for i in range(3)]
    crashed = textwrap.dedent(f"""
        import asyncio, os
        from pqrl.store import TrajectoryStore
        async def main():
            s = TrajectoryStore({redis_server.url!r}, "run1")
            entries = await s.read_groups("trainer", "doomed", count=2)
            print(len(entries), flush=True)
            os._exit(0)  # dies holding two unacknowledged groups
        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", crashed], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "2", out.stderr
    assert await store.pending("trainer") == 2
    assert await store.reclaim("trainer", "rescuer", min_idle_ms=60_000) == []  # not idle long enough
    await asyncio.sleep(0.2)
    rescued = await store.reclaim("trainer", "rescuer", min_idle_ms=100)
    assert [e.entry_id for e in rescued] == ids[:2]
    assert all(e.delivery_count == 2 for e in rescued)
    assert rescued[0].trajectories == make_group("g0")
    fresh = await store.read_groups("trainer", "rescuer", count=10)
    assert [e.entry_id for e in fresh] == ids[2:]
    await store.ack("trainer", ids)
    assert await store.pending("trainer") == 0 and await store.backlog() == 0


async def test_backpressure_releases_as_the_trainer_consumes(redis_server):
    async with TrajectoryStore(redis_server.url, "run1", max_backlog=3) as store:
        await store.create_consumer_group("trainer")
        for i in range(3):
            assert await store.try_put_group(make_group(f"g{i}")) is not None
        assert await store.try_put_group(make_group("g3")) is None
        with pytest.raises(Backpressure) as err:
            await store.put_group(make_group("g3"))
        assert err.value.backlog == 3 and err.value.limit == 3 and "backlog full" in str(err.value)

        waiting = asyncio.create_task(store.put_group(make_group("g3"), timeout=20))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        (entry,) = await store.read_groups("trainer", "t0", count=1)
        assert not waiting.done(), "reading alone must not release space: the entry is not acked"
        await store.ack("trainer", [entry.entry_id])
        new_id = await asyncio.wait_for(waiting, 10)
        assert await store.backlog() == 3
        rest = await store.read_groups("trainer", "t0", count=10)
        assert [e.trajectories[0].group_id for e in rest] == ["g1", "g2", "g3"]
        assert rest[-1].entry_id == new_id


async def test_restart_with_fsync_always_loses_no_acknowledged_write(redis_server):
    url = redis_server.url
    async with TrajectoryStore(url, "run1") as store:
        await store.create_consumer_group("trainer")
        ids = [await store.put_group(make_group(f"g{i}")) for i in range(4)]
        first = await store.read_groups("trainer", "t0", count=2)
        await store.ack("trainer", [first[0].entry_id])  # g0 acked, g1 pending, g2/g3 unread
        await store.publish_policy("/ckpt/step-7", version=7)
        await store.push_tasks([{"id": "task-1"}])
    redis_server.kill()  # SIGKILL: no shutdown save, only what was fsynced survives
    restarted = RedisServer(
        port=redis_server.port, data_dir=redis_server.data_dir, appendfsync="always"
    ).start()
    try:
        async with TrajectoryStore(url, "run1") as store:
            assert (await store.get_policy()).version == 7
            assert (await store.get_policy()).weights == "/ckpt/step-7"
            assert await store.pending("trainer") == 1
            assert await store.backlog() == 3
            await asyncio.sleep(0.05)
            (pending,) = await store.reclaim("trainer", "t1", min_idle_ms=1)
            assert pending.entry_id == ids[1] and pending.trajectories == make_group("g1")
            unread = await store.read_groups("trainer", "t0", count=10)
            assert [e.entry_id for e in unread] == ids[2:]
            assert [t.task for t in await store.take_tasks("rollout", "w")] == [{"id": "task-1"}]
    finally:
        restarted.stop()


async def test_corrupt_entry_goes_to_dead_letters_and_the_rest_is_delivered(store):
    await store.create_consumer_group("trainer")
    good1 = await store.put_group(make_group("g1"))
    bad_id = (await store.redis.xadd(store.groups_key, {"group": b"PQT\x02garbage"})).decode()
    bad_n = (await store.redis.xadd(store.groups_key, {"n": 2, "0": b"x"})).decode()
    good2 = await store.put_group(make_group("g2"))
    entries = await store.read_groups("trainer", "t0", count=10)
    assert [e.entry_id for e in entries] == [good1, good2]
    dead = dict(await store.dead_letters())
    assert set(dead) == {bad_id, bad_n}
    assert "runs past" in dead[bad_id] or "tokens need" in dead[bad_id]
    assert "expected only b'group'" in dead[bad_n]
    raw = await store.redis.xrange(store.dead_key)
    assert raw[0][1][b"field:group"] == b"PQT\x02garbage"  # the original bytes are kept for inspection
    await store.ack("trainer", [good1, good2])
    assert await store.backlog() == 0


async def test_unreachable_redis_names_the_url():
    port = free_port()
    store = TrajectoryStore(f"redis://:secret@127.0.0.1:{port}/0", "run1")
    with pytest.raises(StoreUnavailable) as err:
        await store.put_group(make_group())
    assert f"127.0.0.1:{port}" in str(err.value) and "secret" not in str(err.value)
    with pytest.raises(StoreUnavailable):
        await store.read_groups("trainer", "t0")
    await store.close()


async def test_policy_versions_only_grow(store):
    assert (await store.get_policy()).version == 0 and (await store.get_policy()).weights is None
    versions = await asyncio.gather(*(store.publish_policy(f"/w/{i}") for i in range(20)))
    assert sorted(versions) == list(range(1, 21))
    assert await store.publish_policy("/w/resumed", version=100) == 100
    with pytest.raises(StoreError, match="not above the current 100"):
        await store.publish_policy("/w/old", version=50)
    state = await store.get_policy()
    assert state.version == 100 and state.weights == "/w/resumed"


async def test_task_queue_delivers_once_and_reclaims(store):
    ids = await store.push_tasks([{"id": f"t{i}", "q": "1+1"} for i in range(5)])
    a = await store.take_tasks("rollout", "w1", count=2)
    b = await store.take_tasks("rollout", "w2", count=10)
    assert [t.task["id"] for t in a + b] == [f"t{i}" for i in range(5)]
    await store.ack_tasks("rollout", [t.entry_id for t in b])
    await asyncio.sleep(0.05)
    again = await store.reclaim_tasks("rollout", "w3", min_idle_ms=10)  # w1 died
    assert [t.entry_id for t in again] == ids[:2]
    await store.ack_tasks("rollout", ids[:2])
    assert await store.redis.xlen(store.tasks_key) == 0


async def test_bad_groups_are_rejected_before_anything_is_written(store):
    with pytest.raises(ValueError, match="at least one"):
        await store.put_group([])
    with pytest.raises(ValueError, match="belongs to run 'other'"):
        await store.put_group(make_group(run_id="other"))
    mixed = make_group("g1")[:2] + make_group("g2")[:1]
    with pytest.raises(ValueError, match="group_id 'g2'"):
        await store.put_group(mixed)
    with pytest.raises(TypeError):
        await store.put_group([{"tokens": [1, 2]}])
    assert await store.backlog() == 0
    with pytest.raises(ValueError):
        TrajectoryStore("redis://127.0.0.1:1/0", "bad:run")


async def test_backlog_bound_with_two_producers_overshoots_by_at_most_one(redis_server):
    a = TrajectoryStore(redis_server.url, "run1", max_backlog=3)
    b = TrajectoryStore(redis_server.url, "run1", max_backlog=3)
    try:
        for i in range(3):
            assert await a.try_put_group(make_group(f"a{i}")) is not None
        # b last saw an empty stream, so it adds without looking: one group over the bound ...
        assert await b.try_put_group(make_group("b0")) is not None
        # ... and from then on both refuse until consumers make room.
        assert await b.try_put_group(make_group("b1")) is None
        assert await a.try_put_group(make_group("a3")) is None
        assert await a.backlog() == 4
    finally:
        await a.close()
        await b.close()


async def test_store_recovers_when_redis_comes_back(redis_server):
    async with TrajectoryStore(redis_server.url, "run1") as store:
        await store.create_consumer_group("trainer")
        first = await store.put_group(make_group("g0"))
        redis_server.kill()
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{redis_server.port}"):
            await store.put_group(make_group("g1"))
        back = RedisServer(
            port=redis_server.port, data_dir=redis_server.data_dir, appendfsync="always"
        ).start()
        try:
            second = await store.put_group(make_group("g1"))  # the same client reconnects
            entries = await store.read_groups("trainer", "t0", count=10)
            assert [e.entry_id for e in entries] == [first, second]
        finally:
            back.stop()


async def test_a_task_batch_is_queued_once_per_run(store):
    tasks = [{"id": f"t{i}"} for i in range(3)]
    assert await store.push_tasks_once("suite@abc", tasks) == 3
    assert await store.push_tasks_once("suite@abc", tasks) is None
    assert await store.push_tasks_once("suite@def", tasks[:1]) == 1
    got = await store.take_tasks("rollout", "w", count=10)
    assert [t.task["id"] for t in got] == ["t0", "t1", "t2", "t0"]


async def test_staleness_gate_admits_within_the_budget_and_frees_on_progress(store):
    gate = {"max_concurrent": 3, "max_staleness": 1, "groups_per_step": 2}
    # version 0: (1 + 0 + 1) * 2 = 4 groups may be accepted or running, at most 3 at once
    assert [await store.gate_admit(**gate) for _ in range(4)] == [True, True, True, False]
    await store.gate_finish(accepted=True)
    assert await store.gate_admit(**gate)  # 3 running + 1 accepted = 4: the budget is now full
    await store.gate_finish(accepted=True)
    assert not await store.gate_admit(**gate), "2 accepted + 2 running is the budget at version 0"
    await store.publish_policy("/w/1")  # the trainer took a step: version 1 adds groups_per_step
    assert await store.gate_admit(**gate)
    assert await store.gate_state() == {"accepted": 2, "running": 3, "rejected": 0}
    await store.gate_finish(accepted=False)  # a dropped group frees its place
    await store.gate_reject(2)  # the trainer dropped two accepted groups
    assert await store.gate_state() == {"accepted": 0, "running": 2, "rejected": 3}
    await store.gate_reset(groups_per_step=2)
    assert await store.gate_state() == {"accepted": 2, "running": 0, "rejected": 3}


async def test_gate_never_over_admits_under_concurrency(store):
    gate = {"max_concurrent": 100, "max_staleness": 0, "groups_per_step": 5}
    results = await asyncio.gather(*(store.gate_admit(**gate) for _ in range(40)))
    assert sum(results) == 5


async def test_peek_shows_recent_groups_without_consuming_them(store):
    await store.create_consumer_group("trainer")
    ids = [await store.put_group(make_group(f"g{i}")) for i in range(3)]
    bad = (await store.redis.xadd(store.groups_key, {"group": b"junk"})).decode()
    peeked = await store.peek_groups(3)
    assert [e for e, _ in peeked] == [ids[1], ids[2], bad]
    assert peeked[0][1] == make_group("g1") and "shorter than the 8-byte prefix" in str(peeked[2][1])
    assert len(await store.read_groups("trainer", "t", count=10)) == 3, "nothing was consumed"
    assert await store.dead_letters() != []  # reading (not peeking) dead-letters the junk
