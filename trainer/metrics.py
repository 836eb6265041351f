"""Training metrics: what the groups say about the policy, written as JSONL and TensorBoard events.

Names are namespaced (``rollout/reward_mean``, ``losses/pg_loss``, ``offpolicy/...``, ``perf/...``,
``eval/...``). The JSONL file is the source of truth (one line per logged step, appended, so a
resumed run continues it); TensorBoard events are a view of the same numbers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pqrl.trajectory import Status, ToolStatus, Trajectory

__all__ = ["MetricsWriter", "plot_curves", "read_metrics", "rollout_metrics"]


def rollout_metrics(
    groups: Sequence[Sequence[Trajectory]], *, pass_threshold: float = 1.0
) -> dict[str, float]:
    """Reward, pass rate and episode shape over every valid trajectory of ``groups``."""
    trajs = [t for g in groups for t in g if t.status is not Status.FAILED_INFRA]
    n_all = sum(len(g) for g in groups)
    out = {"rollout/groups": float(len(groups)), "rollout/failed_infra_frac": 1 - len(trajs) / max(n_all, 1)}
    if not trajs:
        return out
    n = len(trajs)
    calls = [c for t in trajs for turn in t.turns for c in turn.tool_calls]
    out |= {
        "rollout/reward_mean": sum(t.reward for t in trajs) / n,
        "rollout/pass_rate": sum(t.reward >= pass_threshold for t in trajs) / n,
        "rollout/response_tokens": sum(t.num_generated for t in trajs) / n,
        "rollout/turns": sum(len(t.turns) for t in trajs) / n,
        "rollout/tool_calls": len(calls) / n,
        "rollout/tool_error_rate": sum(c.status is not ToolStatus.OK for c in calls) / max(len(calls), 1),
        "rollout/reward_zero_frac": sum(t.reward == 0.0 for t in trajs) / n,
        # truncation is the third source of q != p: shown on its own
        "offpolicy/truncated_frac": sum(t.truncation is not None for t in trajs) / n,
    }
    for phase in ("generate_s", "open_s", "tools_s", "grade_s", "total_s"):  # seconds per episode
        times = [t.timings[phase] for t in trajs if phase in t.timings]
        if times:
            out[f"time/episode_{phase}"] = sum(times) / len(times)
    return out


class MetricsWriter:
    """Appends ``{"step", "time", **metrics}`` lines to ``metrics.jsonl``; mirrors to TensorBoard."""

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self._tb: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The logged lines; where a resumed run logged a step again, the later line wins. A line that
    is not a whole record (the one a running job is appending) is skipped."""
    by_step: dict[tuple[int, bool], dict[str, Any]] = {}
    p = Path(path)
    if not p.is_file():
        return []
    for line in p.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            by_step[(row["step"], any(k.startswith("eval/") for k in row))] = row
    return [by_step[k] for k in sorted(by_step)]


def plot_curves(metrics_path: str | Path, png_path: str | Path) -> Path:
    """Reward and pass rate over steps (training samples; held-out eval where logged) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in [
        ("rollout/reward_mean", "reward (train samples)"),
        ("rollout/pass_rate", "pass rate (train samples)"),
        ("eval/pass@1", "held-out greedy pass@1"),
        ("eval/pass@k", "held-out pass@k"),
    ]:
        pts = [(r["step"], r[key]) for r in rows if key in r]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o" if key.startswith("eval") else "", label=label)
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    ax.set_title(Path(metrics_path).parent.name)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return Path(png_path)
