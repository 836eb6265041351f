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

``--target P``: time to target instead. The job runs with its own evaluation every ``--eval-every``
steps (on the config's held-out suite, "before" included) and is stopped (Ctrl-C twice) at the first
evaluation whose greedy pass@1 reaches ``P``; ``minutes`` is the wall time from the job's start to
the end of that evaluation, so evaluations count. With ``--baseline-commit C`` the same protocol
first runs on a checkout of commit C (its own code and its own copy of the config), and the JSON
line gives both times and their ratio. Each side runs from a checkout of its commit (``--commit``,
default HEAD). Usage:
  python bench/learn_calc.py --target 0.6 --baseline-commit a404185
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.checkout import worktree  # noqa: E402
from bench.learning import greedy_pass, held_out, report, short_commit, train  # noqa: E402


def time_to_target(repo: Path, config: str, out: Path, args: argparse.Namespace) -> dict:
    """Runs the job from checkout ``repo`` until an evaluation reaches ``args.target``; its evaluations
    as ``[step, pass@1, minutes]`` and the minutes to the target (None if never reached)."""
    from launcher.jobconfig import load_config

    run_dir = out / load_config(config).run
    cmd = [sys.executable, "-m", "launcher.cli", "train", config, "--fresh", "--quiet",
           "--set", f"eval.every={args.eval_every}", "--set", f"train.steps={args.steps}",
           "--set", f"train.max_time_min={args.minutes}", "--set", f"output_dir={out}"]  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    log = open(out.with_suffix(".log"), "w")  # noqa: SIM115 - the child writes it until it exits
    t0 = time.time()
    job = subprocess.Popen(cmd, cwd=repo, env=os.environ | {"PYTHONPATH": str(repo)}, stdout=log, stderr=log)
    evals, reached, seen = [], None, 0
    while job.poll() is None and reached is None:
        time.sleep(2)
        lines = (
            (run_dir / "metrics.jsonl").read_text().splitlines()
            if (run_dir / "metrics.jsonl").exists()
            else []
        )
        for line in lines[seen:]:
            m = json.loads(line)
            if "eval/pass@1" in m:
                evals.append([m["step"], m["eval/pass@1"], round((m["time"] - t0) / 60, 2)])
                print(f"{repo.name}: eval at step {m['step']}: {m['eval/pass@1']:.3f} ({evals[-1][2]} min)",
                      file=sys.stderr)  # fmt: skip
                if m["eval/pass@1"] >= args.target and reached is None:
                    reached = evals[-1][2]
        seen = len(lines)
    if job.poll() is None:  # reached: stop at once, keep what was trained
        for _ in range(2):
            job.send_signal(signal.SIGINT)
            time.sleep(1)
        job.wait(timeout=600)
    log.close()
    return {"minutes": reached, "evals": evals, "exit": job.returncode}


def target_main(args: argparse.Namespace) -> None:
    out = Path(args.output_dir)
    result: dict = {"target": args.target, "eval_every": args.eval_every}
    sides = [("baseline", args.baseline_commit)] if args.baseline_commit else []
    for side, commit in [*sides, ("new", args.commit)]:
        with worktree(commit) as repo:  # each side runs from a checkout of its commit
            config = str(repo / Path(args.config).resolve().relative_to(ROOT))
            result[side] = {"commit": short_commit(repo)} | time_to_target(
                repo, config, out / f"target_{side}", args
            )
    new = result.pop("new")
    result |= new
    base_min = result.get("baseline", {}).get("minutes")
    if base_min and result["minutes"]:
        result["ratio"] = round(result["minutes"] / base_min, 3)
    result["pass_rate_after"] = result["evals"][-1][1] if result["evals"] else None
    print(json.dumps(result))


def main() -> None:
    from launcher.jobconfig import load_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="the job's step budget")
    ap.add_argument("--minutes", type=float, default=55.0, help="wall-clock budget of the training job")
    ap.add_argument("--eval-tasks", type=int, default=128)
    ap.add_argument("--config", default=str(ROOT / "examples" / "quickstart.yaml"))
    ap.add_argument("--output-dir", default=str(ROOT / "runs" / "bench"))
    ap.add_argument("--target", type=float, help="time to this greedy pass@1 instead (see above)")
    ap.add_argument("--eval-every", type=int, default=2, help="--target: evaluate every N steps")
    ap.add_argument("--baseline-commit", help="--target: run the same protocol on this commit first")
    ap.add_argument("--commit", default="HEAD", help="--target: the commit measured (default HEAD)")
    ap.add_argument("--from-run", help="no training: evaluate this run directory's latest checkpoint (a run "
                    "cut short, or trained elsewhere with the same --config)")  # fmt: skip
    args = ap.parse_args()
    if args.target is not None:
        return target_main(args)

    cfg = load_config(args.config)
    suite = held_out(cfg, args.eval_tasks)
    before = greedy_pass(suite, cfg.model.name, cfg, "before")
    if args.from_run:
        run_dir = Path(args.from_run)
        ckpt = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
        summary = {"steps": json.loads((ckpt / "state.json").read_text())["step"]}
        final, minutes = ckpt / "model", float("nan")
    else:
        summary, run_dir, final, minutes = train(
            args.config, args.output_dir, steps=args.steps, minutes=args.minutes
        )
    after = greedy_pass(suite, str(final), cfg, "after")
    print(json.dumps(report(before, after, run_dir, summary, minutes)))


if __name__ == "__main__":
    main()
