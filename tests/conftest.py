"""Shared fixtures: a real redis-server per test on a free loopback port, and trajectory factories."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from pqrl.redis_server import RedisServer
from pqrl.store import TrajectoryStore
from pqrl.trajectory import ToolCall, Trajectory, Truncation, Turn
from tests.models import served, smollm, tiny_model_dir, updatable  # noqa: F401  (fixtures for every package)


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    server = RedisServer(data_dir=tmp_path / "redis", appendfsync="always").start()
    yield server
    server.close()


@pytest.fixture
async def store(redis_server) -> AsyncIterator[TrajectoryStore]:
    s = TrajectoryStore(redis_server.url, "run1", max_backlog=0)
    yield s
    await s.close()


def make_trajectory(
    *,
    run_id: str = "run1",
    group_id: str = "g0",
    index: int = 0,
    prompt_len: int = 5,
    turn_lens: tuple[tuple[int, int], ...] = ((4, 3), (2, 0)),
    seed: int = 0,
    reward: float = 1.0,
) -> Trajectory:
    """A multi-turn record: prompt, then per turn (generated tokens, observation tokens)."""
    rng = np.random.default_rng(seed)
    T = prompt_len + sum(g + o for g, o in turn_lens)
    generated = np.zeros(T, np.uint8)
    turns = []
    pos = prompt_len
    for i, (g, o) in enumerate(turn_lens):
        generated[pos : pos + g] = 1
        calls = (ToolCall("calculator", {"expr": f"{i}+1"}, "ok"),) if o else ()
        turns.append(Turn(pos, pos + g, "stop", calls))
        pos += g + o
    loss_mask = generated.copy()
    versions = np.where(generated == 1, 3, -1).astype(np.int32)
    logprobs = np.where(generated == 1, -rng.random(T), 0).astype(np.float32)
    return Trajectory(
        id=f"{group_id}-{index}",
        run_id=run_id,
        task_id="task-7",
        group_id=group_id,
        env="calc-v1",
        tokens=rng.integers(0, 49152, T).astype(np.int32),
        generated=generated,
        loss_mask=loss_mask,
        behavior_logprobs=logprobs,
        versions=versions,
        prompt_len=prompt_len,
        turns=tuple(turns),
        reward=reward,
        reward_info={"exact": True, "f1": 0.5},
        status="completed",
        truncation=None if index % 2 == 0 else Truncation("cut_tool_output", T - 1, "64 KiB cap"),
        timings={"generate_s": 0.25},
    )


def make_group(group_id: str = "g0", size: int = 4, run_id: str = "run1") -> list[Trajectory]:
    return [
        make_trajectory(run_id=run_id, group_id=group_id, index=i, seed=i, reward=i % 2) for i in range(size)
    ]
