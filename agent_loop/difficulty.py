"""Pass-rate estimation for the difficulty filter, through the normal rollout path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from agent_loop.agent import EpisodeConfig, run_episode
from engine.protocol import Engine
from env_server.client import EnvClient
from loss_masking import ChatRenderer
from pqrl.trajectory import Status
from tasks.storage import queued_task
from tasks.suite import Suite

__all__ = ["estimate_rewards"]


async def estimate_rewards(
    suite: Suite,
    *,
    engine: Engine,
    env: EnvClient,
    renderer: ChatRenderer,
    samples: int = 8,
    cfg: EpisodeConfig | None = None,
    concurrency: int = 16,
    progress: Callable[[int, int], Any] | None = None,
) -> dict[str, list[float]]:
    """``samples`` episode rewards per task (failed_infra episodes are left out, not scored 0)."""
    gate = asyncio.Semaphore(concurrency)
    rewards: dict[str, list[float]] = {t.id: [] for t in suite.tasks}
    total, done = len(suite.tasks) * samples, 0

    async def one(k: int, i: int) -> None:
        nonlocal done
        async with gate:
            t = await run_episode(queued_task(suite, k), engine=engine, env=env, renderer=renderer,
                                  run_id="difficulty", group_id=f"d{k}", index=i, cfg=cfg)  # fmt: skip
        if t.status is not Status.FAILED_INFRA:
            rewards[suite.tasks[k].id].append(t.reward)
        done += 1
        if progress is not None:
            progress(done, total)

    await asyncio.gather(*(one(k, i) for k in range(len(suite.tasks)) for i in range(samples)))
    return rewards
