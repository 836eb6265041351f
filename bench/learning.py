"""What the learning benchmarks share: greedy pass@1 on held-out tasks (the config's eval suite with
its seed, ``n`` tasks), a ``pqrl train`` job run as a child process, and the report.

The interval is paired by task: ``d_i = after_i - before_i``, ``mean(d) +- 1.96 sd(d) / sqrt(n)``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def short_commit(repo: Path) -> str:
    """The checked-out commit of ``repo``, abbreviated (recorded with a benchmark's figures)."""
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip


def tree_differs(repo: Path) -> bool:
    """Whether ``repo``'s tracked files differ from its commit (a figure then comes from neither)."""
    return bool(subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip())  # fmt: skip


def held_out(cfg: Any, n: int) -> Any:
    """The config's eval suite with ``n`` tasks; refuses a seed that training also uses."""
    ref = cfg.eval.suite
    if ref is None or ref.generate is None:
        sys.exit("the config needs a generated eval suite (eval.suite.generate)")
    same = [s for s in cfg.tasks.suites if s.generate == ref.generate and s.seed == ref.seed]
    if same:
        sys.exit("held-out tasks must come from a seed that training does not use")
    return ref.model_copy(update={"n": n}).build()


async def _greedy(
    suite: Any, model: str, cfg: Any, env_url: str | None, token: str | None
) -> dict[str, bool]:
    from agent_loop.evaluation import evaluate
    from engine.client import EngineClient
    from env_server.client import HttpEnvClient, LocalEnvClient
    from launcher.jobconfig import episode_config
    from launcher.rollout_commands import local_engine
    from loss_masking import ChatRenderer
    from pqrl.model_cache import load_tokenizer

    with local_engine(model) as url:
        engine = EngineClient(url)
        env = HttpEnvClient(env_url, token=token) if env_url else LocalEnvClient()
        try:
            result = await evaluate(suite, engine=engine, env=env, cfg=episode_config(cfg), k=1,
                                    renderer=ChatRenderer(load_tokenizer(model)))  # fmt: skip
        finally:
            await engine.aclose()
            await env.aclose()
    if result.refused:
        sys.exit(f"no pass rate: {result.refused['eval/pass@1']}")
    return result.solved


def greedy_pass(
    suite: Any, model: str, cfg: Any, label: str, env_url: str | None = None, token: str | None = None
) -> dict[str, bool]:
    """Greedy outcome per task of ``model`` (served by a fresh built-in engine), printed to stderr."""
    t0 = time.monotonic()
    solved = asyncio.run(_greedy(suite, model, cfg, env_url, token))
    print(f"{label}: {sum(solved.values())}/{len(solved)} ({time.monotonic() - t0:.0f}s)", file=sys.stderr)
    return solved


def train(
    config: str, output_dir: str, *, steps: int, minutes: float, sets: list[str] = (), env: dict | None = None
):
    """Runs ``pqrl train`` fresh; returns (its summary, the run directory, the final model, minutes)."""
    from launcher.jobconfig import load_config

    cfg = load_config(config)
    cmd = [sys.executable, "-m", "launcher.cli", "train", config, "--fresh", "--quiet",
           "--set", f"train.steps={steps}", "--set", f"train.max_time_min={minutes}",
           "--set", f"output_dir={output_dir}"]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    t0 = time.monotonic()
    job = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | (env or {}))
    took = (time.monotonic() - t0) / 60
    if job.returncode != 0:
        sys.exit(f"training job failed ({job.returncode}):\n{job.stderr[-4000:]}")
    summary = json.loads(job.stdout.strip().splitlines()[-1])
    run_dir = Path(output_dir) / cfg.run
    final = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip() / "model"
    return summary, run_dir, final, took


async def containers_left(run: str, wait_s: float = 30.0) -> int:
    """Sandbox containers still labelled ``run`` after waiting up to ``wait_s`` for their removal."""
    from sandboxes.docker_api import DockerAPI

    api = DockerAPI()
    try:
        deadline = time.monotonic() + wait_s
        while (left := await api.list({"pqrl.run": run})) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        return len(left)
    finally:
        await api.close()


def report(
    before: dict[str, bool], after: dict[str, bool], run_dir: Path, summary: dict, minutes: float
) -> dict:
    """The JSON line's common keys: pass rates, paired interval, steps, minutes and the run's curves."""
    from agent_loop.evaluation import paired_improvement
    from trainer.metrics import read_metrics

    rows = [m for m in read_metrics(run_dir / "metrics.jsonl") if "rollout/groups" in m]
    hist: collections.Counter[int] = collections.Counter()
    for m in rows:
        for k, v in m.items():
            if k.startswith("offpolicy/staleness_") and k.rsplit("_", 1)[1].isdigit():
                hist[int(k.rsplit("_", 1)[1])] += int(v)
    kl = [m["offpolicy/mismatch_kl"] for m in rows if "offpolicy/mismatch_kl" in m]
    mean, low, _ = paired_improvement(before, after)
    n = len(before)

    def curve(key: str) -> list[float]:
        return [round(m.get(key, float("nan")), 3) for m in rows]

    return {
        "pass_rate_before": sum(before.values()) / n,
        "pass_rate_after": sum(after.values()) / n,
        "ci95_low": round(low, 4),
        "improvement": round(mean, 4),
        "steps": summary["steps"],
        "minutes": round(minutes, 1),
        "eval_tasks": n,
        "weight_updates_applied": sum(1 for m in rows if m.get("rollout/trajectories_used", 0) > 0),
        "staleness_hist": dict(sorted(hist.items())),
        "mismatch_kl_mean": sum(kl) / len(kl) if kl else None,
        "reward_curve": curve("rollout/reward_mean"),
        "train_pass_curve": curve("rollout/pass_rate"),
        "tool_calls_curve": curve("rollout/tool_calls"),
        "failed_infra_curve": curve("rollout/failed_infra_frac"),
        "groups_curve": curve("rollout/groups"),
        "clipfrac_last5": [round(m.get("losses/clipfrac", 0.0), 4) for m in rows[-5:]],
    }
