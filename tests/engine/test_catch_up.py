"""An engine restarted mid-run comes back serving its base weights: the rollout side loads the run's
current ones on it before the next group, and a trainer's weight push skips an engine that is down
(it catches up when back) while still failing on one that answered and could not load."""

from __future__ import annotations

import asyncio

import pytest

from agent_loop.config import ManagerConfig
from agent_loop.manager import RolloutManager
from engine.client import EngineClient
from engine.errors import WeightUpdateFailed
from pqrl.redis_server import free_port
from pqrl.store import TrajectoryStore

pytestmark = pytest.mark.timeout(300)


def _down() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_a_behind_engine_catches_up_and_a_down_one_is_left_for_later(updatable):
    url, engine, path, _ = updatable

    async def go() -> None:
        async with EngineClient([url, _down()], connect_retries=0) as client:
            assert await client.catch_up_from_disk(str(path), 3) == [url]
            assert engine.weight_version == "3"
            assert await client.catch_up_from_disk(str(path), 3) == [], "already current"
            assert await client.catch_up_from_disk(str(path), 2) == [], "never back to an older version"
            with pytest.raises(WeightUpdateFailed, match="127.0.0.1"):
                await client.update_weights_from_disk(str(path), 4)
            await client.update_weights_from_disk(str(path), 4, skip_unreachable=True)
            assert engine.weight_version == "4"
            with pytest.raises(WeightUpdateFailed, match="does-not-exist"):
                await client.update_weights_from_disk("/does-not-exist", 5, skip_unreachable=True)

    asyncio.run(go())


def test_the_rollout_manager_brings_an_engine_to_the_runs_policy_before_a_group(updatable, redis_server):
    url, engine, path, _ = updatable

    async def go() -> None:
        async with TrajectoryStore(redis_server.url, "r") as store, EngineClient([url]) as client:
            await store.policy.publish(str(path), version=7)
            manager = RolloutManager(store, client, None, None, ManagerConfig(groups_per_step=1))  # type: ignore[arg-type]
            await manager._serve_the_current_policy()
            assert engine.weight_version == "7"

    asyncio.run(go())
