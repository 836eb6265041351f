"""The rollout manager against a real env server process (real HTTP), the built-in engine and Redis:
a permanent job-wide fault stops it at once with the task left queued, a task's own permanent fault
(its reset rejects it, its grader fails its own gold) dead-letters that task at once and the manager
goes on, a sandbox backend that is down is waited
for only within its grace; ``/readyz`` tells a down Docker from a live one."""

from __future__ import annotations

import time

import httpx
import pytest

from agent_loop.agent import EpisodeConfig
from agent_loop.manager import TASK_CONSUMER_GROUP, ManagerConfig, RolloutManager
from engine.client import EngineClient
from env_server import RewardResult
from env_server import registry as registry_module
from env_server.app import ServerSettings, create_app
from env_server.client import HttpEnvClient
from env_server.registry import register_environment
from loss_masking import ChatRenderer
from pqrl.errors import PermanentFault
from pqrl.store import TrajectoryStore
from tasks.calc import CalcEnv, calc_suite
from tasks.coding.grader import GoldReferenceError
from tasks.storage import queued_task
from tests.servers import env_server_process, serve_in_thread

pytestmark = pytest.mark.timeout(180)

EPISODE = EpisodeConfig(max_turns=1, max_new_tokens=8, max_total_tokens=768, seed=3)
TOKEN = "right-token"


def _cfg(**kw) -> ManagerConfig:
    base = {"group_size": 2, "groups_per_step": 4, "max_staleness": 100, "infra_backoff_s": 0.05,
            "max_concurrent_groups": 2, "episode": EPISODE}  # fmt: skip
    return ManagerConfig(**(base | kw))


@pytest.fixture(scope="module")
def env_server():
    with env_server_process(TOKEN, insecure_local="false") as server:
        yield server


async def _pending(store: TrajectoryStore) -> int:
    info = await store.redis.xpending(store.tasks.key, TASK_CONSUMER_GROUP)
    return int(info["pending"])


async def _run(store, engine_url, smollm, env, cfg) -> tuple[float, object]:
    engine = EngineClient(engine_url)
    t0 = time.monotonic()
    try:
        return 0.0, await RolloutManager(store, engine, env, ChatRenderer(smollm[1]), cfg).run()
    except PermanentFault as e:
        return time.monotonic() - t0, e
    finally:
        await engine.aclose()
        await env.aclose()


async def test_a_wrong_token_stops_the_manager_at_once_and_the_task_stays_queued(
    served, smollm, redis_server, env_server
):
    store = TrajectoryStore(redis_server.url, "token")
    try:
        await store.tasks.push([queued_task(calc_suite(2, seed=1), i) for i in range(2)])
        wrong = HttpEnvClient(env_server.url, token="wrong", backoff_s=0.01)
        took, fault = await _run(store, served[0], smollm, wrong, _cfg())
        assert isinstance(fault, PermanentFault) and fault.exit_code == 3, fault
        assert took < 10, f"{took:.1f} s"
        assert "403" in str(fault) and "invalid token" in str(fault) and "token" in fault.fix, fault.line()
        assert await store.tasks.dead() == [] and await store.groups.produced() == 0
        assert await _pending(store) >= 1, "the leased task is not acknowledged"
        # the job again, fixed: its tasks were not spent
        assert await store.tasks.requeue_pending(TASK_CONSUMER_GROUP) >= 1
        right = HttpEnvClient(env_server.url, token=TOKEN)
        _, stats = await _run(store, served[0], smollm, right, _cfg())
        assert stats.groups_written == 2 and stats.tasks_dead_lettered == 0, stats
        assert await _pending(store) == 0
    finally:
        await store.close()


async def test_an_unknown_environment_stops_the_manager_at_once(served, smollm, redis_server, env_server):
    store = TrajectoryStore(redis_server.url, "unknown")
    try:
        await store.tasks.push([{**queued_task(calc_suite(1, seed=1), 0), "env_id": "nope-v1"}])
        env = HttpEnvClient(env_server.url, token=TOKEN, backoff_s=0.01)
        took, fault = await _run(store, served[0], smollm, env, _cfg())
        assert isinstance(fault, PermanentFault) and took < 10, (took, fault)
        assert "unknown environment 'nope-v1'" in str(fault) and "env_id" in fault.fix, fault.line()
        assert await _pending(store) == 1 and await store.tasks.dead() == []
    finally:
        await store.close()


async def test_a_task_its_reset_rejects_is_dead_lettered_at_once_and_the_rest_run(
    served, smollm, redis_server, env_server
):
    store = TrajectoryStore(redis_server.url, "badtask")
    try:
        good = [queued_task(calc_suite(2, seed=5), i) for i in range(2)]
        bad = {"env_id": "calc-v1", "task_id": "bad-1", "task": {"question": "1+1", "answer": "two"}}
        await store.tasks.push([good[0], bad, good[1]])
        env = HttpEnvClient(env_server.url, token=TOKEN, backoff_s=0.01)
        took, stats = await _run(store, served[0], smollm, env, _cfg(infra_retries=3))
        assert not isinstance(stats, Exception), stats
        assert stats.groups_written == 2 and stats.tasks_dead_lettered == 1, stats
        assert "infra_retry" not in stats.failures, "a bad task is not retried"
        assert stats.failures["dead_lettered"] == 1 and list(stats.dead_tasks) == ["bad-1"]
        assert "calc-v1 rejected the task: ValidationError" in stats.dead_tasks["bad-1"], stats.dead_tasks
        ((task, reason),) = await store.tasks.dead()
        assert task == bad and "bad_task" not in reason and "rejected the task" in reason, reason
        assert await _pending(store) == 0, "no lease is left pending"
    finally:
        await store.close()


async def test_when_every_task_is_bad_the_manager_stops(served, smollm, redis_server, env_server):
    store = TrajectoryStore(redis_server.url, "allbad")
    try:
        bad = [{"env_id": "calc-v1", "task_id": f"bad-{i}", "task": {}} for i in range(5)]
        await store.tasks.push(bad)
        env = HttpEnvClient(env_server.url, token=TOKEN, backoff_s=0.01)
        _, fault = await _run(store, served[0], smollm, env, _cfg(max_concurrent_groups=1))
        assert isinstance(fault, PermanentFault), fault
        assert "the first 3 tasks all failed permanently" in str(fault) and "rejected" in str(fault), fault
        assert len(await store.tasks.dead()) == 3
    finally:
        await store.close()


def test_readyz_is_503_with_the_cause_while_docker_is_unreachable_and_200_with_it(monkeypatch):
    with env_server_process(TOKEN) as up:
        r = httpx.get(up.url + "/readyz", timeout=10)
        assert r.status_code == 200 and r.json() == {"ok": True}, r.text
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    with env_server_process(TOKEN) as down:
        r = httpx.get(down.url + "/readyz", timeout=10)
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "sandbox_backend_down" and "/nonexistent" in r.json()["detail"], r.text
        assert httpx.get(down.url + "/healthz", timeout=10).status_code == 200, "liveness is not readiness"


async def test_a_docker_that_stays_down_stops_the_manager_after_its_grace(
    served, smollm, redis_server, monkeypatch
):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    store = TrajectoryStore(redis_server.url, "docker")
    try:
        with env_server_process(TOKEN) as server:
            monkeypatch.delenv("DOCKER_HOST")
            await store.tasks.push([{"env_id": "shell-v1", "task_id": "sh", "task": {}}])
            env = HttpEnvClient(server.url, token=TOKEN, backoff_s=0.01)
            took, fault = await _run(store, served[0], smollm, env, _cfg(backend_grace_s=2.0))
        assert isinstance(fault, PermanentFault) and 2.0 <= took < 10, (took, fault)
        assert "still down after 2 s" in str(fault) and "/nonexistent" in str(fault), fault.line()
        assert "DOCKER_HOST" in fault.fix
        assert await _pending(store) == 1 and await store.tasks.dead() == [], "the task waits for the fix"
    finally:
        await store.close()


class GoldFails(CalcEnv):
    """calc-v1 whose grader finds the task's own reference broken (as the coding grader does when the
    gold patch fails its tests)."""

    evaluations = 0

    async def evaluate(self) -> RewardResult:
        GoldFails.evaluations += 1
        raise GoldReferenceError("task calc-x: the gold patch fails its own rewritten checks")


async def test_a_grader_that_fails_its_own_gold_dead_letters_the_task_without_retries(
    served, smollm, redis_server
):
    register_environment("pytest-gold-fails-v1", f"{__name__}:GoldFails")
    store = TrajectoryStore(redis_server.url, "gold")
    try:
        with serve_in_thread(create_app(ServerSettings(token=TOKEN, sandbox_pool_size=0))) as url:
            task = {**queued_task(calc_suite(1, seed=2), 0), "env_id": "pytest-gold-fails-v1"}
            await store.tasks.push([task])
            env = HttpEnvClient(url, token=TOKEN, backoff_s=0.01)
            _, stats = await _run(store, served[0], smollm, env, _cfg(infra_retries=3, group_size=2))
        assert not isinstance(stats, Exception), stats
        assert stats.tasks_dead_lettered == 1 and stats.groups_written == 0, stats
        assert "infra_retry" not in stats.failures and GoldFails.evaluations <= 2, stats.failures
        ((_, reason),) = await store.tasks.dead()
        assert "the gold patch fails its own rewritten checks" in reason, reason
        assert await _pending(store) == 0
    finally:
        registry_module._REGISTRY.pop("pytest-gold-fails-v1", None)
        await store.close()
