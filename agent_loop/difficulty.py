"""Pass-rate estimation for the difficulty filter and evaluation, through the normal rollout path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_loop.agent import EpisodeConfig, run_episode
from engine.protocol import Engine, EngineError
from env_server.client import EnvClient
from loss_masking import ChatRenderer
from pqrl.trajectory import Status
from tasks.storage import queued_task
from tasks.suite import Suite

__all__ = ["Sample", "rewards_that_ran", "run_samples"]


@dataclass(frozen=True)
class Sample:
    """One episode's outcome; a ``failed_infra`` one carries no evidence about the policy."""

    reward: float
    failed_infra: bool = False
    turns: int = 0
    error: str = ""


async def run_samples(
    suite: Suite,
    *,
    engine: Engine,
    env: EnvClient,
    renderer: ChatRenderer,
    samples: int = 8,
    cfg: EpisodeConfig | None = None,
    concurrency: int = 16,
    progress: Callable[[int, int], Any] | None = None,
) -> dict[str, list[Sample]]:
    """``samples`` episode outcomes per task, in order. An episode whose engine failed is
    ``failed_infra`` like one whose environment failed: one broken request costs only its episode."""
    gate = asyncio.Semaphore(concurrency)
    out: dict[str, list[Sample | None]] = {t.id: [None] * samples for t in suite.tasks}
    total, done = len(suite.tasks) * samples, 0

    async def one(k: int, i: int) -> None:
        nonlocal done
        async with gate:
            try:
                t = await run_episode(queued_task(suite, k), engine=engine, env=env, renderer=renderer,
                                      run_id="difficulty", group_id=f"d{k}", index=i, cfg=cfg)  # fmt: skip
            except EngineError as e:
                s = Sample(0.0, failed_infra=True, error=f"engine: {e}")
            else:
                infra = t.status is Status.FAILED_INFRA
                # solved or not is the environment's score; a suite's reward terms shape training only
                score = float(t.reward_info.get("env_reward", t.reward))
                s = Sample(score, infra, len(t.turns), str(t.reward_info.get("error", "")) if infra else "")
        out[suite.tasks[k].id][i] = s
        done += 1
        if progress is not None:
            progress(done, total)

    await asyncio.gather(*(one(k, i) for k in range(len(suite.tasks)) for i in range(samples)))
    return {tid: [s for s in ss if s is not None] for tid, ss in out.items()}


def rewards_that_ran(ran: dict[str, list[Sample]]) -> dict[str, list[float]]:
    """The rewards per task of the episodes that ran (failed_infra ones are left out, not scored 0)."""
    return {tid: [s.reward for s in ss if not s.failed_infra] for tid, ss in ran.items()}
