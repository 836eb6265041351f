"""What truncated importance sampling does against a real engine/trainer mismatch: the quickstart
trained on a vLLM engine with the off-policy weight on (``algorithm.is_mode: truncate``, the
default) and off (``is_mode: off``: every token counts 1), same seeds.

vLLM samples with its own bfloat16 kernels, so its logprobs differ from the trainer's recompute:
that difference is the mismatch the weight ``min(pi_prox / pi_behavior, C)`` corrects. Per arm
and seed the job runs ``pqrl train CONFIG`` with ``services.engine=vllm`` and the seeds of the
task sampler, the trainer and the sampling (``tasks.seed``, ``seed``, ``rollout.seed``) set to the
seed, so the two arms' first batches are the same requests. ``rollout.max_staleness`` is 0 unless
``--set`` says otherwise: every token then comes from the weights being trained, so the weight
corrects the engine's numerics alone (with stale tokens it also corrects staleness, and the job
reports the mismatch on current tokens only). Reported per arm: the learning curve
(reward per step), the mismatch per step (``offpolicy/mismatch_kl``, the weights' mean and max
and the fraction capped; the job logs them in both arms, in the off arm as the weights that would
have applied), and greedy pass@1 on ``--eval-tasks`` held-out tasks (served by a fresh built-in
engine, the same for every model) with the paired 95% interval against the base model; and the
paired difference on minus off, paired by (seed, task).

Usage: python bench/tis_ablation.py [--seeds 0,1] [--steps 6] [--eval-tasks 96]
Needs the vLLM venv (PQRL_SETUP_ENGINES=vllm bash scripts/setup.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning import greedy_pass, held_out, short_commit, train  # noqa: E402

ARMS = {"on": "truncate", "off": "off"}
PER_STEP = {
    "reward": "rollout/reward_mean",
    "mismatch_kl": "offpolicy/mismatch_kl",
    "tis_weight_mean": "offpolicy/tis_weight_mean",
    "tis_weight_max": "offpolicy/tis_weight_max",
    "tis_clipped_frac": "offpolicy/tis_weight_clipped_frac",
    "stale_token_frac": "offpolicy/stale_token_frac",
    "clipfrac": "losses/clipfrac",
}


def curves(run_dir: Path) -> dict[str, list[float | None]]:
    """The run's per-step figures named in ``PER_STEP``, one entry per trained step."""
    from trainer.metrics import read_metrics

    rows = [m for m in read_metrics(run_dir / "metrics.jsonl") if "rollout/groups" in m]
    return {name: [round(m[key], 5) if key in m else None for m in rows] for name, key in PER_STEP.items()}


def paired(a: dict[str, bool], b: dict[str, bool]) -> dict[str, float]:
    """``b - a`` in pass rate, paired by key, with its normal 95% interval."""
    from agent_loop.evaluation import paired_improvement

    mean, low, high = paired_improvement(a, b)
    return {"diff": round(mean, 4), "ci95": [round(low, 4), round(high, 4)], "n": len(a.keys() & b.keys())}


def main() -> None:
    from launcher.jobconfig import load_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "quickstart.yaml"))
    ap.add_argument("--seeds", default="0", help="comma-separated; each arm runs once per seed")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--minutes", type=float, default=20.0, help="wall-clock budget of each job")
    ap.add_argument("--eval-tasks", type=int, default=96)
    ap.add_argument("--engine", default="vllm", help="services.engine of the jobs (builtin: the control)")
    ap.add_argument("--set", action="append", default=None, metavar="FIELD=VALUE",
                    help="config overrides for every job (default: rollout.max_staleness=0)")  # fmt: skip
    ap.add_argument("--output-dir", default=str(ROOT / "runs" / "bench_tis"))
    ap.add_argument("--out", help="also append the JSON line to this file")
    args = ap.parse_args()

    seeds = [int(s) for s in args.seeds.split(",")]
    extra = args.set if args.set is not None else ["rollout.max_staleness=0"]
    cfg = load_config(args.config)
    suite = held_out(cfg, args.eval_tasks)
    header = {"command": " ".join(["python", *sys.argv]), "commit": short_commit(ROOT),
              "load_at_start": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
              "engine": args.engine}  # fmt: skip
    print(json.dumps(header), file=sys.stderr)
    base = greedy_pass(suite, cfg.model.name, cfg, "base")
    runs, solved = [], {arm: {} for arm in ARMS}
    for seed in seeds:
        for arm, mode in ARMS.items():
            sets = [f"services.engine={args.engine}", f"algorithm.is_mode={mode}",
                    f"tasks.seed={seed}", f"seed={seed}", f"rollout.seed={seed}", *extra]  # fmt: skip
            out = Path(args.output_dir) / f"{arm}-seed{seed}"
            summary, run_dir, final, minutes = train(args.config, str(out), steps=args.steps,
                                                     minutes=args.minutes, sets=sets)  # fmt: skip
            after = greedy_pass(suite, str(final), cfg, f"{arm} seed {seed}")
            solved[arm] |= {f"{seed}:{k}": v for k, v in after.items()}
            c = curves(run_dir)
            kl = [x for x in c["mismatch_kl"] if x is not None]
            kl_mean = statistics.fmean(kl) if kl else None
            runs.append({"arm": arm, "seed": seed, "steps": summary["steps"], "minutes": round(minutes, 2),
                         "pass_after": round(sum(after.values()) / len(after), 4),
                         "vs_base": paired(base, after), "mismatch_kl_mean": kl_mean,
                         "curves": c, "load_after": round(os.getloadavg()[0], 2)})  # fmt: skip
            print(json.dumps(runs[-1]), file=sys.stderr)
    base_all = {f"{s}:{k}": v for s in seeds for k, v in base.items()}
    result = {
        "header": header | {"load_at_end": [round(x, 2) for x in os.getloadavg()], "sets": extra},
        "pass_base": round(sum(base.values()) / len(base), 4),
        "arms": {
            arm: {"pass_after": round(sum(s.values()) / len(s), 4), "vs_base": paired(base_all, s)}
            for arm, s in solved.items()
        },  # fmt: skip
        "on_minus_off": paired(solved["off"], solved["on"]),
        "runs": runs,
    }
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
