"""Difficulty filtering: keep the tasks the current policy sometimes solves.

A 0/1 reward with pass rate c has variance c(1 - c): tasks solved always or never give every
sample of a group the same reward, so GRPO's group advantage is zero and they teach nothing.
The rates come from rollouts with the policy (agent_loop.difficulty); this
module only turns them into a filtered suite and a report.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from tasks.suite import Suite, SuiteManifest

__all__ = ["distribution_table", "filter_suite", "pass_rates", "task_table"]


def pass_rates(rewards: Mapping[str, Sequence[float]], *, threshold: float = 1.0) -> dict[str, float]:
    """Per task: the fraction of samples whose reward reached ``threshold``. A task with no sample
    (every episode failed on infrastructure) has no rate: it is left out, not rated 0."""
    return {tid: sum(r >= threshold for r in rs) / len(rs) for tid, rs in rewards.items() if rs}


def filter_suite(suite: Suite, rates: Mapping[str, float], *, low: float = 0.0, high: float = 1.0) -> Suite:
    """The tasks with ``low < rate < high``, as a new suite version (name suffixed ``-filtered``)."""
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"need 0 <= low < high <= 1, got {low}, {high}")
    missing = [t.id for t in suite.tasks if t.id not in rates]
    if missing:
        raise KeyError(f"no pass rate for {len(missing)} tasks, e.g. {missing[:3]}")
    kept = tuple(t for t in suite.tasks if low < rates[t.id] < high)
    m = suite.manifest
    manifest = SuiteManifest(
        **{**m.model_dump(), "name": f"{m.name}-filtered"[:64],
           "description": f"{m.description} | filtered to pass rate in ({low:g}, {high:g}): "
                          f"{len(kept)} of {len(suite.tasks)} tasks"},
    )  # fmt: skip
    return Suite(manifest, kept)


def distribution_table(rates: Mapping[str, float], *, bins: int = 5) -> str:
    """Counts of tasks by pass rate: exactly 0, exactly 1, and ``bins`` bins in between."""
    values = list(rates.values())
    zero, one = sum(v == 0 for v in values), sum(v == 1 for v in values)
    rows = [("pass rate 0 (never solved)", zero)]
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        rows.append((f"({lo:.1f}, {hi:.1f}{']' if b < bins - 1 else ')'}",
                     sum(lo < v <= hi and v != 1 for v in values)))  # fmt: skip
    rows.append(("pass rate 1 (always solved)", one))
    width = max(len(r[0]) for r in rows)
    lines = [f"{label:<{width}}  {n:5d}" for label, n in rows]
    kept = len(values) - zero - one
    lines.append(f"{'kept (0 < c < 1)':<{width}}  {kept:5d} of {len(values)}")
    return "\n".join(lines)


def task_table(rates: Mapping[str, float], kept: Collection[str] = ()) -> str:
    """One row per task: its id, its pass rate and whether the filter kept it."""
    width = max([len("task"), *map(len, rates)])
    rows = [f"{'task':<{width}}  pass  kept"]
    rows += [f"{tid:<{width}}  {rate:4.2f}  {'yes' if tid in kept else 'no'}" for tid, rate in rates.items()]
    return "\n".join(rows)
