"""Does RL learn? ``pqrl train examples/quickstart.yaml`` with only its step budget changed.

Everything real, in embedded mode: a private Redis, the built-in engine as its own process whose
weights are replaced through ``/update_weights_from_disk`` after every step, the calc environment,
the rollout manager with the quickstart's ``max_staleness`` (1) and the trainer. RL only: no SFT and
no demonstrations beyond the suite's two worked examples in the prompt.

Measured here, not by the job: greedy pass@1 (exact answers) on ``--eval-tasks`` held-out calc
tasks (the quickstart's eval seed, disjoint from its training seed), for the base model and for
the final checkpoint, each served by a fresh built-in engine. The improvement's 95% interval is
paired by task: ``d_i = after_i - before_i``, ``mean(d) +- 1.96 sd(d) / sqrt(n)``.

Prints one JSON line: ``{"pass_rate_before", "pass_rate_after", "ci95_low", "steps", "minutes",
"weight_updates_applied", "staleness_hist", "mismatch_kl_mean"}`` plus the training curves' ends.
Target: improvement >= 0.15 with ci95_low > 0.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


async def _greedy_pass(model: str, n: int, seed: int, level: int, shots: int, cfg: dict) -> dict[str, bool]:
    from agent_loop.agent import EpisodeConfig
    from agent_loop.commands import local_engine
    from agent_loop.evaluation import evaluate
    from engine.client import EngineClient
    from env_server.client import LocalEnvClient
    from loss_masking import ChatRenderer
    from pqrl.model_cache import load_tokenizer
    from tasks.calc import calc_suite

    suite = calc_suite(n, seed, level=level, shots=shots)
    episode = EpisodeConfig(max_turns=cfg["max_turns"], max_new_tokens=cfg["max_new_tokens"],
                            max_total_tokens=cfg["max_total_tokens"])  # fmt: skip
    with local_engine(model) as url:
        engine, env = EngineClient(url), LocalEnvClient()
        try:
            _, solved = await evaluate(suite, engine=engine, env=env, cfg=episode, k=1,
                                       renderer=ChatRenderer(load_tokenizer(model)))  # fmt: skip
        finally:
            await engine.aclose()
            await env.aclose()
    return solved


def main() -> None:
    from agent_loop.evaluation import paired_improvement
    from launcher.jobconfig import load_config
    from trainer.metrics import read_metrics

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="the job's step budget")
    ap.add_argument("--minutes", type=float, default=55.0, help="wall-clock budget of the training job")
    ap.add_argument("--eval-tasks", type=int, default=128)
    ap.add_argument("--config", default=str(ROOT / "examples" / "quickstart.yaml"))
    ap.add_argument("--output-dir", default=str(ROOT / "runs" / "bench"))
    args = ap.parse_args()

    cfg = load_config(args.config)
    held_out = cfg.eval.suite
    assert held_out is not None and held_out.generate == "calc"
    train_seeds = {s.seed for s in cfg.tasks.suites}
    assert held_out.seed not in train_seeds, "held-out tasks must come from another seed"
    r = cfg.rollout.model_dump()
    task_args = (held_out.seed, held_out.level, held_out.shots)

    t0 = time.monotonic()
    before = asyncio.run(_greedy_pass(cfg.model.name, args.eval_tasks, *task_args, r))
    print(f"before: {sum(before.values())}/{len(before)} ({time.monotonic() - t0:.0f}s)", file=sys.stderr)

    cmd = [sys.executable, "-m", "launcher.cli", "train", args.config, "--fresh", "--quiet",
           "--set", f"train.steps={args.steps}", "--set", f"train.max_time_min={args.minutes}",
           "--set", f"output_dir={args.output_dir}"]  # fmt: skip
    t1 = time.monotonic()
    job = subprocess.run(cmd, capture_output=True, text=True)
    minutes = (time.monotonic() - t1) / 60
    if job.returncode != 0:
        sys.exit(f"training job failed ({job.returncode}):\n{job.stderr[-4000:]}")
    summary = json.loads(job.stdout.strip().splitlines()[-1])
    run_dir = Path(args.output_dir) / cfg.run
    final = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip() / "model"

    t2 = time.monotonic()
    after = asyncio.run(_greedy_pass(str(final), args.eval_tasks, *task_args, r))
    print(f"after: {sum(after.values())}/{len(after)} ({time.monotonic() - t2:.0f}s)", file=sys.stderr)

    rows = [m for m in read_metrics(run_dir / "metrics.jsonl") if "rollout/groups" in m]
    hist: collections.Counter[int] = collections.Counter()
    for m in rows:
        for k, v in m.items():
            if k.startswith("offpolicy/staleness_") and k.rsplit("_", 1)[1].isdigit():
                hist[int(k.rsplit("_", 1)[1])] += int(v)
    kl = [m["offpolicy/mismatch_kl"] for m in rows if "offpolicy/mismatch_kl" in m]
    mean, low, _ = paired_improvement(before, after)
    n = len(before)
    tail = rows[-5:]

    def curve(key: str) -> list[float]:
        return [round(m.get(key, float("nan")), 3) for m in rows]

    print(json.dumps({
        "pass_rate_before": sum(before.values()) / n,
        "pass_rate_after": sum(after.values()) / n,
        "ci95_low": round(low, 4),
        "improvement": round(mean, 4),
        "steps": summary["steps"],
        "minutes": round(minutes, 1),
        "weight_updates_applied": sum(1 for m in rows if m.get("rollout/trajectories_used", 0) > 0),
        "staleness_hist": dict(sorted(hist.items())),
        "mismatch_kl_mean": sum(kl) / len(kl) if kl else None,
        "reward_curve": curve("rollout/reward_mean"),
        "train_pass_curve": curve("rollout/pass_rate"),
        "tool_calls_curve": curve("rollout/tool_calls"),
        "clipfrac_last5": [round(m.get("losses/clipfrac", 0.0), 4) for m in tail],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
