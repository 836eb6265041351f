"""Does RL learn through sandboxes? ``pqrl train examples/sandbox.yaml``: the data suite, whose
answers exist only in files inside each episode's Docker sandbox.

Everything real: a private Redis and the built-in engine started by the job, and an env server
started here as its own process (token on) that keeps the warm sandbox pool; the job reaches it
over HTTP, and so do both evaluations. RL only: no SFT, no demonstrations beyond the suite's worked
examples in the prompt; ``max_staleness`` 1.

Measured here: greedy pass@1 (exact answers) on ``--eval-tasks`` held-out tasks (the config's eval
seed) for the base model and the final checkpoint, with the paired 95% interval; the sandboxes the
env server created, its failed creations, the episodes that failed on infrastructure, tool calls per
episode and the staleness histogram; and the sandbox containers left once the server stopped.

The last line is JSON with ``bench/learn_calc.py``'s keys plus ``sandboxes_created``,
``sandbox_create_failures``, ``failed_infra_episodes``, ``tool_calls_per_episode`` and
``containers_left``. Target: improvement >= 0.20 with ci95_low > 0 within 60 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import secrets
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning import containers_left, greedy_pass, held_out, report, train  # noqa: E402


def _gauges(url: str, token: str) -> dict[str, float]:
    """The env server's Prometheus gauges and counters, by name (labels summed)."""
    import httpx

    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(?:\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m:
            out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


def main() -> None:
    from launcher.jobconfig import load_config
    from launcher.services import env_server_process

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="the job's step budget")
    ap.add_argument("--minutes", type=float, default=45.0, help="wall-clock budget of the training job")
    ap.add_argument("--eval-tasks", type=int, default=96)
    ap.add_argument("--config", default=str(ROOT / "examples" / "sandbox.yaml"))
    ap.add_argument("--output-dir", default=str(ROOT / "runs" / "bench"))
    args = ap.parse_args()

    t0 = time.monotonic()
    cfg = load_config(args.config)
    suite = held_out(cfg, args.eval_tasks)
    token = secrets.token_urlsafe(24)
    log = Path(args.output_dir) / "bench_env_server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    pool = cfg.rollout.group_size * cfg.rollout.max_concurrent_groups
    with env_server_process(log, token, pool, run="bench-sandbox") as url:
        before = greedy_pass(suite, cfg.model.name, cfg, "before", url, token)
        summary, run_dir, final, minutes = train(
            args.config, args.output_dir, steps=args.steps, minutes=args.minutes,
            # the job's own evaluations are skipped: this script measures on more tasks
            sets=(f"services.env_servers=[{url}]", "eval.suite=null"), env={"PQRL_ENV_TOKEN": token},
        )  # fmt: skip
        after = greedy_pass(suite, str(final), cfg, "after", url, token)
        gauges = _gauges(url, token)
    out = report(before, after, run_dir, summary, minutes)
    episodes = [g * cfg.rollout.group_size for g in out["groups_curve"]]
    infra, calls = out["failed_infra_curve"], [c for c in out["tool_calls_curve"] if c == c]  # nan: no row
    out |= {
        "sandboxes_created": int(gauges.get("pqrl_env_sandbox_pool_created", -1)),
        "sandbox_create_failures": int(gauges.get("pqrl_env_sandbox_pool_create_failures", -1)),
        "failed_infra_episodes": round(sum(f * e for f, e in zip(infra, episodes, strict=True) if f == f)),
        "tool_calls_per_episode": round(sum(calls) / max(len(calls), 1), 3),
        "containers_left": asyncio.run(containers_left("bench-sandbox")),
        "total_minutes": round((time.monotonic() - t0) / 60, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
