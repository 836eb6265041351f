"""Held-out evaluation: greedy pass@1 and sampled pass@k through the normal rollout path.

Runs outside the staleness gate and writes nothing to the trajectory stream: evaluation episodes
are never trained on. An episode that failed on infrastructure (``failed_infra``: a sandbox, the
env server, a grader or the engine) is not a wrong answer: it is counted apart and its task is left
out of the pass rates, and a pass rate is refused (left out, with the reason) when no task ran or
when more than ``max_failed_infra`` of the tasks failed on infrastructure.

Intervals are 95% over tasks: Wilson's score interval for greedy pass@1 (a proportion), a
percentile bootstrap of the mean for pass@k (per-task estimates between 0 and 1).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from agent_loop.agent import EpisodeConfig
from agent_loop.config import MAX_FAILED_INFRA
from agent_loop.difficulty import Sample, run_samples
from engine.protocol import Engine
from env_server.client import EnvClient
from loss_masking import ChatRenderer
from tasks.suite import Suite

__all__ = [
    "MAX_FAILED_INFRA",
    "Evaluation",
    "TaskOutcome",
    "bootstrap_interval",
    "evaluate",
    "paired_improvement",
    "pass_at_k",
    "summarize",
    "wilson_interval",
]

Z95 = 1.959963984540054


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate ``1 - C(n-c, k) / C(n, k)`` of solving in ``k`` tries, from ``n``
    samples of which ``c`` passed."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def wilson_interval(passed: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval of a proportion ``passed / n`` (sound at 0, at 1 and for small n)."""
    if n < 1 or not 0 <= passed <= n:
        raise ValueError(f"need 0 <= passed <= n and n >= 1, got {passed}, {n}")
    p, z2 = passed / n, z * z
    d = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / d
    half = z / d * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_interval(
    values: Sequence[float], *, level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (tasks resampled with replacement;
    seeded, so the same outcomes give the same interval)."""
    if not values:
        raise ValueError("no values")
    x = np.asarray(values, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    means = x[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


@dataclasses.dataclass(frozen=True)
class TaskOutcome:
    """One task's greedy episode and its ``k``-sample episodes."""

    task_id: str
    greedy: Sample
    samples: tuple[Sample, ...] = ()

    def pass_at(self, k: int, threshold: float = 1.0) -> float | None:
        """The task's unbiased pass@k from its samples that ran; None with fewer than ``k`` of them."""
        ran = [s for s in self.samples if not s.failed_infra]
        return pass_at_k(len(ran), sum(s.reward >= threshold for s in ran), k) if len(ran) >= k else None

    def record(self, k: int, threshold: float = 1.0) -> dict[str, Any]:
        """The task's line of the per-task JSONL file."""

        def episode(s: Sample) -> dict[str, Any]:
            out = {"reward": s.reward, "passed": None if s.failed_infra else s.reward >= threshold,
                   "failed_infra": s.failed_infra, "turns": s.turns}  # fmt: skip
            return out | ({"error": s.error} if s.failed_infra else {})

        return {
            "task_id": self.task_id,
            "greedy": episode(self.greedy),
            "samples": [episode(s) for s in self.samples],
            f"pass@{k}": self.pass_at(k, threshold),
        }


@dataclasses.dataclass
class Evaluation:
    """``metrics`` (``eval/...``), the greedy outcome of each task that ran (``solved``, for paired
    comparisons), the pass rates ``refused`` (metric -> why it is left out) and every task's outcome."""

    metrics: dict[str, float]
    solved: dict[str, bool]
    refused: dict[str, str]
    tasks: list[TaskOutcome]
    k: int

    @property
    def pass_at_1(self) -> float | None:
        return self.metrics.get("eval/pass@1")


def _rate(
    name: str,
    values: list[float],
    total: int,
    interval: Callable[[list[float]], tuple[float, float]],
    max_failed_infra: float,
    causes: collections.Counter[str],
) -> tuple[dict[str, float], str | None]:
    """The rate's mean over the tasks that ran with its interval (``NAME_low``, ``NAME_high``), or
    why there is none."""
    lost = total - len(values)
    cause = f"; most common cause: {causes.most_common(1)[0][0]}" if causes else ""
    if not total:
        return {}, "the suite has no task"
    if not values:
        return {}, f"no task ran: {lost} of {total} failed on infrastructure{cause}"
    if lost > max_failed_infra * total:
        return {}, (f"{lost} of {total} tasks failed on infrastructure, more than the "
                    f"{max_failed_infra:.0%} a pass rate is reported with{cause}")  # fmt: skip
    low, high = interval(values)
    return {name: sum(values) / len(values), f"{name}_low": low, f"{name}_high": high}, None


def summarize(
    tasks: Sequence[TaskOutcome],
    *,
    k: int,
    threshold: float = 1.0,
    max_failed_infra: float = MAX_FAILED_INFRA,
) -> Evaluation:
    """The metrics of finished episodes: pass@1 over the tasks whose greedy episode ran, pass@k over
    those with at least ``k`` samples that ran, each with its 95% interval, and the counts."""
    n = len(tasks)
    causes = collections.Counter(s.error for t in tasks for s in (t.greedy, *t.samples) if s.failed_infra)
    ran = [t for t in tasks if not t.greedy.failed_infra]
    solved = {t.task_id: t.greedy.reward >= threshold for t in ran}
    metrics = {
        "eval/tasks": float(n),
        "eval/tasks_run": float(len(ran)),
        "eval/failed_infra": float(sum(causes.values())),
    }
    rates = {"eval/pass@1": ([float(v) for v in solved.values()], _wilson)}
    if any(t.samples for t in tasks):
        estimates = [e for e in (t.pass_at(k, threshold) for t in tasks) if e is not None]
        metrics |= {"eval/k": float(k), "eval/tasks_run@k": float(len(estimates))}
        rates["eval/pass@k"] = (estimates, bootstrap_interval)
    refused: dict[str, str] = {}
    for name, (values, interval) in rates.items():
        rate, why = _rate(name, values, n, interval, max_failed_infra, causes)
        metrics |= rate
        if why is not None:
            refused[name] = why
    return Evaluation(metrics, solved, refused, list(tasks), k)


def _wilson(passed: list[float]) -> tuple[float, float]:
    return wilson_interval(round(sum(passed)), len(passed))


async def evaluate(
    suite: Suite,
    *,
    engine: Engine,
    env: EnvClient,
    renderer: ChatRenderer,
    cfg: EpisodeConfig,
    k: int = 4,
    samples: int | None = None,
    pass_threshold: float = 1.0,
    max_failed_infra: float = MAX_FAILED_INFRA,
    progress: Callable[[int, int], Any] | None = None,
) -> Evaluation:
    """Greedy pass@1 and, for ``k > 1``, pass@k from ``samples`` (default ``k``) episodes per task at
    ``cfg.temperature``; see ``summarize``.

    The greedy and the sampled episodes run together, so the engine batches them (and shares each
    task's prompt among them); ``progress`` counts both."""
    n, samples = len(suite.tasks), max(samples or k, k)
    counts = {"greedy": (0, n)} | ({"sampled": (0, n * samples)} if k > 1 else {})  # part: (done, total)

    def count(part: str) -> Callable[[int, int], None]:
        def report(done: int, total: int) -> None:
            counts[part] = (done, total)
            if progress is not None:
                progress(*map(sum, zip(*counts.values(), strict=True)))

        return report

    def run(part: str, m: int, episode: EpisodeConfig) -> Awaitable[dict[str, list[Sample]]]:
        return run_samples(suite, engine=engine, env=env, renderer=renderer, samples=m, cfg=episode,
                           progress=count(part))  # fmt: skip

    parts = [run("greedy", 1, dataclasses.replace(cfg, temperature=0.0, seed=0))]
    if k > 1:
        parts.append(run("sampled", samples, cfg))
    greedy, *sampled = await asyncio.gather(*parts)
    tasks = [
        TaskOutcome(t.id, greedy[t.id][0], tuple(sampled[0][t.id]) if sampled else ()) for t in suite.tasks
    ]
    return summarize(tasks, k=k, threshold=pass_threshold, max_failed_infra=max_failed_infra)


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
