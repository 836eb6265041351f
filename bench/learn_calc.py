"""Does RL learn? ``pqrl train examples/quickstart.yaml`` with only its step budget changed.

Everything real, in embedded mode: a private Redis, the built-in engine as its own process whose
weights are replaced through ``/update_weights_from_disk`` after every step, the calc environment,
the rollout manager with the quickstart's ``max_staleness`` (1) and the trainer. RL only: no SFT and
no demonstrations beyond the suite's two worked examples in the prompt.

Measured here, not by the job: greedy pass@1 (exact answers) on ``--eval-tasks`` held-out calc
tasks (the quickstart's eval seed, disjoint from its training seed), for the base model and for
the final checkpoint, each served by a fresh built-in engine, with the paired 95% interval.

Prints one JSON line: ``{"pass_rate_before", "pass_rate_after", "ci95_low", "improvement", "steps",
"minutes", "weight_updates_applied", "staleness_hist", "mismatch_kl_mean"}`` plus the training
curves. Target: improvement >= 0.15 with ci95_low > 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning import greedy_pass, held_out, report, train  # noqa: E402


def main() -> None:
    from launcher.jobconfig import load_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="the job's step budget")
    ap.add_argument("--minutes", type=float, default=55.0, help="wall-clock budget of the training job")
    ap.add_argument("--eval-tasks", type=int, default=128)
    ap.add_argument("--config", default=str(ROOT / "examples" / "quickstart.yaml"))
    ap.add_argument("--output-dir", default=str(ROOT / "runs" / "bench"))
    args = ap.parse_args()

    cfg = load_config(args.config)
    suite = held_out(cfg, args.eval_tasks)
    before = greedy_pass(suite, cfg.model.name, cfg, "before")
    summary, run_dir, final, minutes = train(
        args.config, args.output_dir, steps=args.steps, minutes=args.minutes
    )
    after = greedy_pass(suite, str(final), cfg, "after")
    print(json.dumps(report(before, after, run_dir, summary, minutes)))


if __name__ == "__main__":
    main()
