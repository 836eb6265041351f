"""Does the coding path run? A short ``pqrl train examples/coding.yaml``: SmolLM2's own edits in
real sandboxes, graded by the hidden tests and the held-out expectations, trained on.

The job starts its own env server process (coding-v1 needs sandboxes) with a warm pool. A 135M
model rarely fixes a bug, so most groups carry no signal and the point is the path, not learning:
this prints where an episode's time goes (generation, opening the session: a sandbox from the pool
and the repository's setup, the tool calls, the grading), the reward distribution, tool calls per
episode, infrastructure failures, and whether the metrics, the plot and no leftover container are
there. Last line: JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning import containers_left, train  # noqa: E402


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return round(sum(values) / len(values), 3) if values else None


def main() -> None:
    from trainer.metrics import read_metrics

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--config", default=str(ROOT / "examples" / "coding.yaml"))
    ap.add_argument("--output-dir", default=str(ROOT / "runs" / "bench"))
    ap.add_argument("--set", action="append", default=[], help="more config overrides, FIELD=VALUE")
    args = ap.parse_args()

    summary, run_dir, _, minutes = train(args.config, args.output_dir, steps=args.steps, minutes=args.minutes,
                                         sets=tuple(args.set))  # fmt: skip
    rows = [m for m in read_metrics(run_dir / "metrics.jsonl") if "rollout/groups" in m]
    episodes = sum(r["rollout/groups"] for r in rows) * int(_group_size(run_dir))
    zero, one = _mean(rows, "rollout/reward_zero_frac"), _mean(rows, "rollout/pass_rate")
    partial = None if zero is None or one is None else round(1 - zero - one, 3)
    print(json.dumps({
        "steps": summary["steps"],
        "minutes": round(minutes, 1),
        "episodes": int(episodes),
        "generate_s_per_episode": _mean(rows, "time/episode_generate_s"),
        "open_s_per_episode": _mean(rows, "time/episode_open_s"),
        "tools_s_per_episode": _mean(rows, "time/episode_tools_s"),
        "grade_s_per_episode": _mean(rows, "time/episode_grade_s"),
        "total_s_per_episode": _mean(rows, "time/episode_total_s"),
        "reward_distribution": {"0": zero, "partial": partial, "1": one},
        "reward_mean": _mean(rows, "rollout/reward_mean"),
        "tool_calls_per_episode": _mean(rows, "rollout/tool_calls"),
        "tool_error_rate": _mean(rows, "rollout/tool_error_rate"),
        "failed_infra_frac": _mean(rows, "rollout/failed_infra_frac"),
        "steps_that_trained": sum(1 for r in rows if r.get("rollout/trajectories_used", 0) > 0),
        "metrics_rows": len(rows),
        "plot": (run_dir / "curves.png").exists(),
        "containers_left": asyncio.run(containers_left(run_dir.name)),
    }))  # fmt: skip


def _group_size(run_dir: Path) -> int:
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]["group_size"]


if __name__ == "__main__":
    main()
