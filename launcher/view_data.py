"""What ``pqrl view`` shows, read from a run directory: the rollout log's Parquet files
(``trainer.rollout_log``) and ``metrics.jsonl``. Read afresh on every request, so a running job's new
steps appear; a file still being written is invisible (it is renamed into place when whole)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from pqrl.errors import UsageError

__all__ = ["RunLog"]

# the per-trajectory figures of a step's table (no token arrays: those come with one episode)
SUMMARY = ("id", "group_id", "task_id", "env", "status", "reward", "advantage", "used", "drop_reason",
           "staleness", "truncated", "num_tokens", "num_generated", "num_turns", "tool_calls",
           "tool_errors", "policy_version")  # fmt: skip
# metrics.jsonl series the run page plots, with their labels
SERIES = {
    "rollout/reward_mean": "reward (mean)",
    "rollout/pass_rate": "pass rate",
    "offpolicy/mismatch_kl": "mismatch KL (engine vs trainer)",
    "rollout/tool_error_rate": "tool error rate",
    "eval/pass@1": "held-out pass@1",
}


class RunLog:
    """A run directory's rollout log and metrics."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / "rollouts"
        if not self.run_dir.is_dir():
            raise UsageError(
                f"{run_dir}: no such run directory", fix="give OUTPUT_DIR/RUN of a pqrl train job"
            )
        self._vocab: list[str] | None = None
        self._cache: dict[int, tuple[int, list[dict[str, Any]]]] = {}  # step -> (mtime, figures)

    def steps(self) -> list[int]:
        from trainer.rollout_log import logged_steps

        return logged_steps(self.dir)

    def _read(self, step: int, columns: list[str] | None = None, where: tuple[str, str] | None = None) -> Any:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from trainer.rollout_log import step_file

        path = step_file(self.dir, step)
        if not path.is_file():
            raise KeyError(f"no step {step} in the rollout log")
        table = pq.read_table(path, columns=columns)
        if where is not None:
            table = table.filter(pc.equal(table[where[0]], where[1]))
        return table

    def run(self) -> dict[str, Any]:
        """Per step: trajectories, how many trained, drops by reason, mean reward, pass rate (reward
        1), tool error rate; the run's staleness histogram; the metrics file's series."""
        per_step, staleness, dropped = [], Counter[int](), Counter[str]()
        unreadable: list[dict[str, Any]] = []
        for step in self.steps():
            try:
                rows = self._figures(step)
            except (KeyError, FileNotFoundError):  # removed by retention meanwhile
                continue
            except Exception as e:  # noqa: BLE001 - one damaged file must not hide the others
                unreadable.append({"step": step, "error": f"{type(e).__name__}: {e}"})
                continue
            reasons = Counter(r["drop_reason"] for r in rows if r["drop_reason"])
            dropped.update(reasons)
            staleness.update(r["staleness"] for r in rows if r["staleness"] is not None)
            n, calls = len(rows), sum(r["tool_calls"] for r in rows)
            per_step.append({
                "step": step, "trajectories": n, "trained": sum(r["used"] for r in rows),
                "dropped": dict(reasons), "reward_mean": sum(r["reward"] for r in rows) / max(n, 1),
                "pass_rate": sum(r["reward"] >= 1.0 for r in rows) / max(n, 1),
                "tool_error_rate": sum(r["tool_errors"] for r in rows) / calls if calls else None,
            })  # fmt: skip
        return {
            "run": self.run_dir.name,
            "steps": per_step,
            "staleness": {str(k): v for k, v in sorted(staleness.items())},
            "dropped": dict(dropped),
            "unreadable": unreadable,
            "metrics": self._metrics(),
        }

    def _figures(self, step: int) -> list[dict[str, Any]]:
        """The small columns of a step's file, read once per version of the file."""
        from trainer.rollout_log import step_file

        stamp = step_file(self.dir, step).stat().st_mtime_ns
        if self._cache.get(step, (None,))[0] != stamp:
            columns = ["reward", "used", "drop_reason", "staleness", "tool_calls", "tool_errors"]
            self._cache[step] = (stamp, self._read(step, columns).to_pylist())
        return self._cache[step][1]

    def _metrics(self) -> dict[str, list[list[float]]]:
        from trainer.metrics import read_metrics

        out: dict[str, list[list[float]]] = {k: [] for k in SERIES}
        for row in read_metrics(self.run_dir / "metrics.jsonl"):  # a resumed run's repeats once
            for key in SERIES:
                if isinstance(row.get(key), int | float) and math.isfinite(row[key]):
                    out[key].append([row["step"], row[key]])
        return out

    def step(self, step: int) -> list[dict[str, Any]]:
        return _clean(self._read(step, list(SUMMARY)).to_pylist())

    def episode(self, step: int, traj_id: str) -> dict[str, Any]:
        rows = self._read(step, where=("id", traj_id)).to_pylist()
        if not rows:
            raise KeyError(f"no trajectory {traj_id!r} in step {step}")
        return self._full(rows[0])

    def group(self, step: int, group_id: str) -> list[dict[str, Any]]:
        rows = self._read(step, where=("group_id", group_id)).to_pylist()
        if not rows:
            raise KeyError(f"no group {group_id!r} in step {step}")
        return [self._full(r) for r in sorted(rows, key=lambda r: r["id"])]

    def _full(self, row: dict[str, Any]) -> dict[str, Any]:
        for key in ("reward_info", "turns", "truncation", "timings"):
            row[key] = None if row[key] is None else json.loads(row[key])
        vocab = self.vocab()
        row["texts"] = [vocab[t] if t < len(vocab) else f"<{t}>" for t in row["tokens"]] if vocab else None
        return _clean([row])[0]

    def vocab(self) -> list[str] | None:
        if self._vocab is None and (self.dir / "vocab.json").is_file():
            self._vocab = json.loads((self.dir / "vocab.json").read_text())
        return self._vocab


def _clean(value: Any) -> Any:
    """NaN and infinities (a token the trainer did not score, a reward_info's own) as null: JSON
    has none of them, and the browser would refuse the whole reply."""
    if isinstance(value, float):
        return round(value, 5) if math.isfinite(value) else None
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value
