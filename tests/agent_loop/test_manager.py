"""The rollout manager with real parts: the built-in engine over HTTP, in-process environments,
Redis. Groups are complete, the staleness gate holds, and a dead manager's leases are reclaimed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from agent_loop.agent import EpisodeConfig
from agent_loop.manager import ManagerConfig, RolloutManager
from engine.client import EngineClient
from env_server import RewardResult
from env_server import registry as registry_module
from env_server.app import ServerSettings, create_app
from env_server.client import HttpEnvClient, LocalEnvClient
from env_server.registry import register_environment
from loss_masking import ChatRenderer
from pqrl.store import TrajectoryStore
from pqrl.trajectory import Status
from tasks.calc import CalcEnv, calc_suite
from tasks.storage import SuiteStore, queued_task
from tests.servers import serve_in_thread

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


class GraderCrashesOnce(CalcEnv):
    """calc-v1 whose grader raises, every time, for one episode: the first one scored."""

    evaluations = 0
    cursed: object = None  # the session whose grader raises

    async def evaluate(self) -> RewardResult:
        GraderCrashesOnce.evaluations += 1
        GraderCrashesOnce.cursed = GraderCrashesOnce.cursed or self
        if self is GraderCrashesOnce.cursed:
            raise RuntimeError("grader bug on this episode")
        return await super().evaluate()


CRASH_ENV = "pytest-grader-crash-v1"


@pytest.fixture
def crashing_env_server() -> Iterator[str]:
    """An env server over loopback HTTP serving calc-v1 with a grader that raises once."""
    register_environment(CRASH_ENV, f"{__name__}:GraderCrashesOnce")
    GraderCrashesOnce.evaluations, GraderCrashesOnce.cursed = 0, None
    try:
        with serve_in_thread(create_app(ServerSettings(token="crash", sandbox_pool_size=0))) as url:
            yield url
    finally:
        registry_module._REGISTRY.pop(CRASH_ENV, None)


@pytest.mark.parametrize("infra_retries", [0, 1])
async def test_a_grader_crash_fails_one_episode_not_the_group(
    served, smollm, redis_server, crashing_env_server, infra_retries
):
    """The crash is that episode's failed_infra with the cause (re-run while infra_retries allow,
    as for any infrastructure failure); the group's other episodes are scored and written."""
    group_size = 4
    store = TrajectoryStore(redis_server.url, "crash")
    engine = EngineClient(served[0])
    env = HttpEnvClient(crashing_env_server, token="crash")
    try:
        await store.tasks.push([{**queued_task(calc_suite(1, seed=8), 0), "env_id": CRASH_ENV}])
        cfg = ManagerConfig(group_size=group_size, groups_per_step=4, infra_retries=infra_retries,
                            min_valid=2, episode=EPISODE)  # fmt: skip
        stats = await RolloutManager(store, engine, env, ChatRenderer(smollm[1]), cfg).run()
        assert stats.groups_written == 1 and stats.groups_dropped == 0, stats
        await store.groups.create_consumer_group("trainer")
        (entry,) = await store.groups.read("trainer", "t", count=5)
        failed = [t for t in entry.trajectories if t.status is Status.FAILED_INFRA]
        scored = [t for t in entry.trajectories if t.status is not Status.FAILED_INFRA]
        if infra_retries == 0:
            assert dict(stats.failures) == {"failed_infra": 1}, stats.failures
            (crashed,) = failed
            error = crashed.reward_info["error"]
            assert "RuntimeError: grader bug on this episode" in error and crashed.reward == 0.0, error
            assert crashed.num_generated > 0, "the crashed episode's turns are kept for metrics"
        else:  # re-run once, and the re-run was graded
            assert dict(stats.failures) == {"infra_retry": 1} and failed == [], stats.failures
        assert len(entry.trajectories) == group_size and len(scored) == group_size - len(failed)
        assert all("expected" in t.reward_info for t in scored), "every other episode was graded"
        assert GraderCrashesOnce.evaluations == group_size + infra_retries, "a grader crash was retried"
        assert await store.gate.state() == {"accepted": 1, "running": 0, "rejected": 0}
        async with httpx.AsyncClient(base_url=crashing_env_server, timeout=10) as raw:
            assert (await raw.get("/healthz")).json() == {"ok": True, "sessions": 0}
        info = await env.create_session(CRASH_ENV, queued_task(calc_suite(1, seed=8), 0)["task"])
        assert (await env.evaluate(info.session_id)).reward == 0.0, "the server grades after the crash"
        await env.close_session(info.session_id)
    finally:
        await env.aclose()
        await engine.aclose()
        await store.close()


async def test_a_manager_rides_out_a_redis_restart(parts, redis_server):
    """Redis goes away mid-run and comes back (same data, appendfsync always): the manager keeps
    running, waits at admission while it is gone, and every task still ends as one stored group."""
    store, engine, env, renderer, suites = parts
    await suites.submit(calc_suite(4, seed=6), "mgr")
    await store.groups.create_consumer_group("trainer")
    cfg = ManagerConfig(group_size=2, groups_per_step=8, max_concurrent_groups=1, lease_timeout_s=3,
                        episode=EPISODE)  # fmt: skip
    manager = RolloutManager(store, engine, env, renderer, cfg)
    running = asyncio.create_task(manager.run())
    for _ in range(600):
        if manager.stats.groups_written >= 1:
            break
        await asyncio.sleep(0.1)
    redis_server.kill()
    await asyncio.sleep(8.0)  # longer than a group: its end and the next admission meet the outage
    redis_server.start()
    stats = await asyncio.wait_for(running, timeout=240)
    entries = await store.groups.read("trainer", "t", count=20)
    assert {e.trajectories[0].task_id for e in entries} == {f"calc-6-{i}" for i in range(4)}, stats
    assert (await store.gate.state())["running"] == 0


class _ServerRestartsMidEpisode(HttpEnvClient):
    """The real client, except that the server forgets each session before it is stepped or scored,
    as an env server restarted mid-episode does (the DELETE and the 404 after it are the server's)."""

    async def _forget(self, session_id):
        async with httpx.AsyncClient(base_url=self.urls[0], timeout=10) as raw:
            headers = {"Authorization": "Bearer crash"}
            await raw.delete(f"/sessions/{session_id}", headers=headers)

    async def step(self, session_id, tool_calls, request_id=None):
        await self._forget(session_id)
        return await super().step(session_id, tool_calls, request_id)

    async def evaluate(self, session_id):
        await self._forget(session_id)
        return await super().evaluate(session_id)


async def test_a_session_lost_with_its_server_is_an_infrastructure_failure(
    served, smollm, redis_server, crashing_env_server
):
    """A session gone from its env server (restarted mid-episode) fails that episode as failed_infra,
    rerun like any other: the group is not lost to an exception."""
    store = TrajectoryStore(redis_server.url, "lost")
    engine = EngineClient(served[0])
    env = _ServerRestartsMidEpisode(crashing_env_server, token="crash")
    try:
        await store.tasks.push([queued_task(calc_suite(1, seed=9), 0)])
        cfg = ManagerConfig(group_size=2, groups_per_step=4, infra_retries=0, episode=EPISODE)
        stats = await RolloutManager(store, engine, env, ChatRenderer(smollm[1]), cfg).run()
        assert stats.groups_dropped == 1 and stats.failures["failed_infra"] == 2, stats
        assert stats.failures["group_too_few_valid"] == 1 and "NotFound" not in stats.failures
    finally:
        await env.aclose()
        await engine.aclose()
        await store.close()


class GraderNeverAnswers(CalcEnv):
    """calc-v1 whose grader waits an hour: its groups finish only if something cancels them."""

    sessions = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        GraderNeverAnswers.sessions += 1

    async def evaluate(self) -> RewardResult:
        await asyncio.sleep(3600)
        return await super().evaluate()


SLOW_ENV = "pytest-slow-grader-v1"


async def test_a_group_too_stale_to_train_is_cancelled_and_its_task_run_again_once(parts):
    """Its tokens came from version 0; once the policy is at 1 with max_staleness 0 the trainer could
    not use them, so the manager cancels the group while it waits (on a grader that would take an
    hour), frees its place in the gate and queues the task again, once: the rerun, also generated
    at version 0, is cancelled too and the task given up. The manager then ends, the queue empty."""
    store, engine, env, renderer, suites = parts
    register_environment(SLOW_ENV, f"{__name__}:GraderNeverAnswers")
    GraderNeverAnswers.sessions = 0
    await store.tasks.push([{**queued_task(calc_suite(1, seed=9), 0), "env_id": SLOW_ENV}])
    cfg = ManagerConfig(group_size=2, groups_per_step=1, max_staleness=0, max_concurrent_groups=2,
                        stale_requeues=1, episode=EPISODE)  # fmt: skip
    manager = RolloutManager(store, engine, env, renderer, cfg)
    running = asyncio.create_task(manager.run())
    try:
        for _ in range(600):  # both episodes generated and wait for their grade
            if (
                len(env.manager._sessions) == 2
                and manager._generating
                and all(t.oldest is not None for w in manager._generating.values() for t in w.taps)
            ):
                break
            await asyncio.sleep(0.1)
        assert manager.stats.groups_culled == 0, "a group within the staleness budget was cancelled"
        await store.policy.publish("/w/1")
        done, _ = await asyncio.wait([running], timeout=120)
        assert done, "the stale group was not cancelled: it waits for its grader"
        stats = running.result()
    finally:
        if not running.done():  # cancel the hour-long graders
            manager.abandon()
            await running
        registry_module._REGISTRY.pop(SLOW_ENV, None)
    assert stats.groups_culled == 2 and stats.groups_written == 0, stats
    assert GraderNeverAnswers.sessions == 4, "the task ran twice, two episodes each"
    assert env.manager.live == 0, "the cancelled episodes closed their sessions"
    assert await store.gate.state() == {"accepted": 0, "running": 0, "rejected": 2}
    assert await store.tasks.take("rollout", "probe", count=5) == [], "the task was given up after one rerun"
