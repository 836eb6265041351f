"""Does the algorithm switch matter? The same short calc job for each advantage estimator.

``pqrl train examples/quickstart.yaml`` (or ``--config``) once per estimator, with the same seeds,
the same step and time budget and only ``algorithm`` changed: ``grpo``, ``dr_grpo`` (with its
constant normaliser, ``loss_agg: seq_mean_token_sum_norm``), ``rloo`` and ``ppo`` (the critic and
GAE). Everything else is the job as shipped: RL only, embedded mode, the built-in engine.

Measured per estimator, from a fresh built-in engine each time: greedy pass@1 on ``--eval-tasks``
held-out tasks before (once, shared) and after, with the paired 95% interval; and from the run's
metrics: wall minutes, the mean |advantage| over the steps, the mean clip fraction, the entropy of
the last trained step, the weight updates applied (and, for ppo, the last value loss).

Prints one JSON object keyed by estimator name (the last line). No winner is expected from a run
this short; the point is that the switch is real and what it changes is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning import greedy_pass, held_out, train  # noqa: E402

# what each estimator sets in the job's algorithm section
VARIANTS = {
    "grpo": ["algorithm.advantage=grpo"],
    "dr_grpo": ["algorithm.advantage=dr_grpo", "algorithm.loss_agg=seq_mean_token_sum_norm"],
    "rloo": ["algorithm.advantage=rloo"],
    "ppo": ["algorithm.advantage=ppo"],
}


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def summarise(run_dir: Path) -> dict:
    """The training-side figures of one run, from its metrics."""
    from trainer.metrics import read_metrics

    rows = [m for m in read_metrics(run_dir / "metrics.jsonl") if "rollout/groups" in m]
    trained = [m for m in rows if m.get("rollout/trajectories_used", 0) > 0]
    last = trained[-1] if trained else {}
    return {
        "weight_updates_applied": len(trained),
        "adv_abs_mean": _mean([m["advantages/abs_mean"] for m in trained if "advantages/abs_mean" in m]),
        "clipfrac_mean": _mean([m["losses/clipfrac"] for m in trained if "losses/clipfrac" in m]),
        "entropy_last": round(last["policy/entropy"], 4) if "policy/entropy" in last else None,
        "value_loss_last": round(last["losses/value_loss"], 4) if "losses/value_loss" in last else None,
        "reward_curve": [round(m.get("rollout/reward_mean", float("nan")), 3) for m in rows],
    }


def main() -> None:
    from agent_loop.evaluation import paired_improvement
    from launcher.jobconfig import load_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="each job's step budget")
    ap.add_argument("--minutes", type=float, default=20.0, help="each job's wall-clock budget")
    ap.add_argument("--eval-tasks", type=int, default=64)
    ap.add_argument("--estimators", default=",".join(VARIANTS), help="comma-separated subset")
    ap.add_argument("--config", default=str(ROOT / "examples" / "quickstart.yaml"))
    ap.add_argument("--output-dir", default=str(ROOT / "runs" / "bench_algorithms"))
    args = ap.parse_args()

    names = args.estimators.split(",")
    unknown = set(names) - set(VARIANTS)
    if unknown:
        sys.exit(f"unknown estimators {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    cfg = load_config(args.config)
    suite = held_out(cfg, args.eval_tasks)
    before = greedy_pass(suite, cfg.model.name, cfg, "before")
    out: dict[str, dict] = {}
    for name in names:
        summary, run_dir, final, minutes = train(
            args.config, str(Path(args.output_dir) / name), steps=args.steps, minutes=args.minutes,
            sets=[*VARIANTS[name], "eval.suite=null"],  # measured here instead, on more tasks
        )  # fmt: skip
        after = greedy_pass(suite, str(final), cfg, f"{name} after")
        mean, low, _ = paired_improvement(before, after)
        out[name] = {
            "pass_rate_before": sum(before.values()) / len(before),
            "pass_rate_after": sum(after.values()) / len(after),
            "improvement": round(mean, 4),
            "ci95_low": round(low, 4),
            "steps": summary["steps"],
            "minutes": round(minutes, 1),
            **summarise(run_dir),
        }
        print(name, json.dumps(out[name]), file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
