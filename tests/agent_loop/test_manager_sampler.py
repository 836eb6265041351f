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
from tasks.storage import SuiteStore, WeightedSuite, queued_task, task_key

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
        cfg = ManagerConfig(group_size=2, groups_per_step=4, max_concurrent_groups=2, episode=EPISODE)
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


async def test_outcomes_are_recorded_and_a_flat_task_gives_up_its_next_draw(served, smollm, redis_server):
    """skip_flat 1 over 3 tasks and 2 epochs: a task whose first group had equal rewards (whatever
    the model earned) skips its second-epoch slot, one with signal runs again; the recorded
    outcomes say which, and the schedule is walked to its end."""
    suite = calc_suite(3, seed=12, shots=0)
    suites = SuiteStore(redis_server.url)
    await suites.configure_sampler("flat", [WeightedSuite(suite)], epochs=2, seed=4, skip_flat=1)
    await suites.aclose()
    store = TrajectoryStore(redis_server.url, "flat")
    engine, env = EngineClient(served[0]), LocalEnvClient()
    try:
        await store.groups.create_consumer_group("trainer")
        cfg = ManagerConfig(group_size=2, groups_per_step=8, max_concurrent_groups=1, episode=EPISODE)
        stats = await RolloutManager(store, engine, env, ChatRenderer(smollm[1]), cfg).run()
        entries = await store.groups.read("trainer", "t", count=10)
        rewards = collections.defaultdict(list)
        for e in entries:
            rewards[e.trajectories[0].task_id].append({t.reward for t in e.trajectories})
        assert stats.groups_written == len(entries) and await store.sampler.position() == 6
        for i, task in enumerate(suite.tasks):
            first = rewards[task.id][0]
            runs = 1 if len(first) == 1 else 2  # flat: the second draw was given up
            assert len(rewards[task.id]) == runs, (task.id, rewards[task.id])
            seen = await store.sampler.outcome(task_key(queued_task(suite, i)))
            assert seen.skipped == 2 - runs and seen.flat == (len(rewards[task.id][-1]) == 1)
    finally:
        await engine.aclose()
        await env.aclose()
        await store.close()
