"""The rollout manager with real parts: the built-in engine over HTTP, in-process environments,
Redis. Groups are complete, the staleness gate holds, and a dead manager's leases are reclaimed."""

from __future__ import annotations

import asyncio

import pytest

from agent_loop.agent import EpisodeConfig
from agent_loop.manager import ManagerConfig, RolloutManager
from engine.client import EngineClient
from env_server.client import LocalEnvClient
from loss_masking import ChatRenderer
from pqrl.store import TrajectoryStore
from tasks.calc import calc_suite
from tasks.storage import SuiteStore

EPISODE = EpisodeConfig(max_turns=2, max_new_tokens=16, max_total_tokens=768, seed=3)


@pytest.fixture
async def parts(served, smollm, redis_server):
    engine_url, _ = served
    store = TrajectoryStore(redis_server.url, "mgr")
    engine, env = EngineClient(engine_url), LocalEnvClient()
    suites = SuiteStore(redis_server.url)
    yield store, engine, env, ChatRenderer(smollm[1]), suites
    await suites.aclose()
    await engine.aclose()
    await env.aclose()
    await store.close()


async def test_every_queued_task_becomes_one_complete_group(parts):
    store, engine, env, renderer, suites = parts
    await suites.submit(calc_suite(3, seed=4), "mgr")
    await store.groups.create_consumer_group("trainer")
    cfg = ManagerConfig(
        group_size=3, groups_per_step=4, max_staleness=1, max_concurrent_groups=2, episode=EPISODE
    )
    stats = await RolloutManager(store, engine, env, renderer, cfg).run()
    assert stats.groups_written == 3 and stats.groups_dropped == 0 and stats.episodes == 9
    entries = await store.groups.read("trainer", "t", count=10)
    assert sorted(len(e.trajectories) for e in entries) == [3, 3, 3]
    assert {e.trajectories[0].task_id for e in entries} == {"calc-4-0", "calc-4-1", "calc-4-2"}
    assert all(len({t.group_id for t in e.trajectories}) == 1 for e in entries)
    assert await store.gate.state() == {"accepted": 3, "running": 0, "rejected": 0}


async def test_the_staleness_gate_waits_for_the_trainer(parts):
    store, engine, env, renderer, suites = parts
    await suites.submit(calc_suite(3, seed=5), "mgr")
    cfg = ManagerConfig(
        group_size=2, groups_per_step=1, max_staleness=0, max_concurrent_groups=3, episode=EPISODE
    )
    manager = RolloutManager(store, engine, env, renderer, cfg)
    running = asyncio.create_task(manager.run(until_empty=False))
    try:
        for _ in range(200):  # version 0, staleness 0, one group per step: exactly one group
            if manager.stats.groups_written == 1:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        assert manager.stats.groups_written == 1, "a second group started before the policy moved"
        assert (await store.gate.state())["running"] == 0
        await store.policy.publish("/w/1")  # the trainer stepped: room for one more
        for _ in range(200):
            if manager.stats.groups_written == 2:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        assert manager.stats.groups_written == 2
    finally:
        manager.stop()
        await running
    assert await store.groups.backlog() == 2


async def test_a_dead_managers_lease_is_reclaimed(parts):
    store, engine, env, renderer, suites = parts
    await suites.submit(calc_suite(1, seed=6), "mgr")
    (lost,) = await store.tasks.take("rollout", "dead-manager", count=1)  # leased, never finished
    await asyncio.sleep(0.3)
    cfg = ManagerConfig(
        group_size=2, groups_per_step=4, max_concurrent_groups=1, lease_timeout_s=0.2, episode=EPISODE
    )
    stats = await RolloutManager(store, engine, env, renderer, cfg).run()
    assert stats.groups_written == 1
    await store.groups.create_consumer_group("trainer")
    (entry,) = await store.groups.read("trainer", "t", count=5)
    assert entry.trajectories[0].task_id == lost.task["task_id"]
