"""The rollout manager on a run with a task sampler: it follows the schedule (epochs included), stops
when the schedule is over, and reports the sampler position. Real engine over HTTP, real Redis."""

from __future__ import annotations

import collections
import logging

from agent_loop.agent import EpisodeConfig
from agent_loop.manager import ManagerConfig, RolloutManager
from engine.client import EngineClient
from env_server.client import LocalEnvClient
from loss_masking import ChatRenderer
from pqrl.store import TrajectoryStore
from tasks.calc import calc_suite
from tasks.storage import SuiteStore, WeightedSuite

EPISODE = EpisodeConfig(max_turns=1, max_new_tokens=8, max_total_tokens=768, seed=3)


async def test_the_manager_runs_the_schedule_to_its_end(served, smollm, redis_server, caplog):
    suite = calc_suite(2, seed=8, shots=0)  # a short prompt: the test is about the schedule
    suites = SuiteStore(redis_server.url)
    await suites.configure_sampler("smp", [WeightedSuite(suite)], epochs=2, seed=4)
    await suites.aclose()
    store = TrajectoryStore(redis_server.url, "smp")
    engine, env = EngineClient(served[0]), LocalEnvClient()
    try:
        await store.groups.create_consumer_group("trainer")
        cfg = ManagerConfig(
            group_size=2, groups_per_step=4, max_concurrent_groups=2, min_valid=1, episode=EPISODE
        )
        with caplog.at_level(logging.INFO, logger="agent_loop.manager"):
            stats = await RolloutManager(store, engine, env, ChatRenderer(smollm[1]), cfg).run()
        assert stats.groups_written == 4 and stats.groups_dropped == 0
        entries = await store.groups.read("trainer", "t", count=10)
        per_task = collections.Counter(e.trajectories[0].task_id for e in entries)
        assert per_task == {"calc-8-0": 2, "calc-8-1": 2}, "two epochs of the suite, then the end"
        assert await store.sampler.position() == 4
        assert "sampler 4/4" in caplog.text
    finally:
        await engine.aclose()
        await env.aclose()
        await store.close()
