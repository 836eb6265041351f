"""Held-out evaluation: greedy pass@1 and sampled pass@k through the normal rollout path.

Runs outside the staleness gate and writes nothing to the trajectory stream: evaluation episodes
are never trained on.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from agent_loop.agent import EpisodeConfig
from agent_loop.difficulty import estimate_rewards
from engine.protocol import Engine
from env_server.client import EnvClient
from loss_masking import ChatRenderer
from tasks.suite import Suite

__all__ = ["evaluate", "paired_improvement"]


async def evaluate(
    suite: Suite,
    *,
    engine: Engine,
    env: EnvClient,
    renderer: ChatRenderer,
    cfg: EpisodeConfig,
    k: int = 4,
    pass_threshold: float = 1.0,
    progress: Callable[[int, int], Any] | None = None,
) -> tuple[dict[str, float], dict[str, bool]]:
    """Returns ``eval/pass@1`` (greedy), ``eval/pass@k`` (``k`` samples at ``cfg.temperature``) and
    the greedy outcome per task id (for paired comparisons between two evaluations).

    The greedy and the sampled episodes run together, so the engine batches them (and shares each
    task's prompt among them); ``progress`` counts both."""
    n = len(suite.tasks)
    counts = {"greedy": (0, n)} | ({"sampled": (0, n * k)} if k > 1 else {})  # part: (done, total)

    def count(part: str) -> Callable[[int, int], None]:
        def report(done: int, total: int) -> None:
            counts[part] = (done, total)
            if progress is not None:
                progress(*map(sum, zip(*counts.values(), strict=True)))

        return report

    def run(part: str, samples: int, episode: EpisodeConfig) -> Awaitable[dict[str, list[float]]]:
        return estimate_rewards(suite, engine=engine, env=env, renderer=renderer, samples=samples,
                                cfg=episode, progress=count(part))  # fmt: skip

    parts = [run("greedy", 1, dataclasses.replace(cfg, temperature=0.0, seed=0))]
    if k > 1:
        parts.append(run("sampled", k, cfg))
    greedy, *sampled = await asyncio.gather(*parts)
    solved = {tid: bool(r) and r[0] >= pass_threshold for tid, r in greedy.items()}
    metrics = {"eval/pass@1": sum(solved.values()) / max(len(solved), 1), "eval/tasks": float(len(solved))}
    if sampled:
        any_pass = [any(x >= pass_threshold for x in r) for r in sampled[0].values()]
        metrics["eval/pass@k"] = sum(any_pass) / max(len(any_pass), 1)
        metrics["eval/k"] = float(k)
    return metrics, solved


def paired_improvement(before: dict[str, bool], after: dict[str, bool]) -> tuple[float, float, float]:
    """Mean per-task change in pass rate and its normal 95% interval (paired by task id)."""
    ids = sorted(before.keys() & after.keys())
    if not ids:
        raise ValueError("no task is in both evaluations")
    d = [float(after[i]) - float(before[i]) for i in ids]
    n = len(d)
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / max(n - 1, 1)
    half = 1.96 * (var / n) ** 0.5
    return mean, mean - half, mean + half
