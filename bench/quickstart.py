"""The quickstart job end to end, variants alternated in one run: wall minutes, eval after, and the
peak resident memory of the job process (trainer, rollout manager, evaluation) and of the engine.

Each run is ``pqrl train examples/quickstart.yaml --fresh --quiet`` plus the variant's ``--set``
overrides; a poller reads ``VmHWM`` of the job process and of every process under it every 0.5 s
(the engine is a child; its largest is reported), and the job's ``VmRSS`` with the number of steps
in the run's metrics file: ``job_rss_by_step`` is the job's largest and smallest resident set
while each step was the last one written (a job whose memory grows from step to step shows here).

    python bench/quickstart.py --variants "stream=,batch=train.stream=false" [--rounds 1]
        [--baseline-commit C]

A variant is ``name=`` followed by comma-free ``field=value`` overrides joined by ``+``. With
``--baseline-commit C`` each variant also runs on commit C's code (a git worktree; ``C:name``),
alternated with this tree's. Prints one JSON line per run, then a summary: per variant the medians
and the ratios to the first variant (to ``C:name`` for ``name`` with a baseline).

``minutes`` is the job's summary figure: in rows with ``phase_s`` (the job's seconds by phase) it
counts from the command's start; in older rows, without it, from the first step's start (after
start-up and the "before" evaluation).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.checkout import worktree  # noqa: E402
from bench.learning import short_commit  # noqa: E402


def _vm_mib(pid: int, key: str = "VmHWM") -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0
    line = next((x for x in status if x.startswith(key + ":")), f"{key}: 0 kB")
    return int(line.split()[1]) // 1024


def _steps_written(metrics: Path) -> int:
    try:
        return metrics.read_text().count('"perf/step_s"')
    except OSError:
        return 0


def _children(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def run(name: str, overrides: list[str], tree: Path = ROOT) -> dict:
    cmd = [sys.executable, "-m", "launcher.cli", "train", "examples/quickstart.yaml", "--fresh", "--quiet"]
    for o in overrides:
        cmd += ["--set", o]
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=tree, stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(tree)}
    )
    job, engine, by_step = 0, 0, {}
    metrics = tree / "runs" / "quickstart" / "metrics.jsonl"
    while proc.poll() is None:
        job = max(job, _vm_mib(proc.pid))
        engine = max([engine, *map(_vm_mib, _children(proc.pid))])
        rss, step = _vm_mib(proc.pid, "VmRSS"), _steps_written(metrics)
        if rss and step:  # from the first step on (the job writes the file afresh)
            hi, lo = by_step.get(step, (0, rss))
            by_step[step] = (max(hi, rss), min(lo, rss))
        time.sleep(0.5)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode:
        raise SystemExit(f"{name}: the job failed (rc {proc.returncode}): {out[-2000:]}")
    summary = json.loads(out.strip().splitlines()[-1])
    steps = []
    for line in (tree / summary["metrics"]).read_text().splitlines():
        m = json.loads(line)
        if "perf/step_s" in m:
            steps.append(
                {k: m.get(k) for k in ("step", "perf/forward_tokens", "perf/micro_batches", "perf/step_s")}
            )
    return {"variant": name, "overrides": overrides, "minutes": summary["minutes"],
            "phase_s": summary.get("phase_s"),
            "wall_minutes": round((time.time() - t0) / 60, 2), "eval_before": summary.get("eval_before"),
            "eval_after": summary["eval_after"],
            "job_peak_mib": job, "engine_peak_mib": engine, "steps": steps,
            "job_rss_by_step": [list(by_step[k]) for k in sorted(by_step)]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="default=", help='"name=f=v+f=v,name2=..."')
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--baseline-commit", help="also run every variant on this commit's code")
    a = ap.parse_args()
    variants = {}
    for spec in a.variants.split(","):
        name, _, sets = spec.partition("=")
        variants[name] = [s for s in sets.split("+") if s]
    print(f"# commit {short_commit(ROOT)}, load {os.getloadavg()}", file=sys.stderr)
    results: dict[str, list[dict]] = {}
    with worktree(a.baseline_commit) as base_tree:
        trees = [(ROOT, "")] + ([(base_tree, f"{a.baseline_commit}:")] if a.baseline_commit else [])
        for r in range(a.rounds):
            for name in list(variants) if r % 2 == 0 else list(reversed(variants)):
                for tree, tag in trees if r % 2 == 0 else trees[::-1]:
                    res = {"tree": tag or short_commit(ROOT), **run(name, variants[name], tree)}
                    results.setdefault(tag + name, []).append(res)
                    print(json.dumps(res), flush=True)
    first = next(iter(variants))
    summary = {}
    for key, runs in results.items():
        med = {
            k: statistics.median(x[k] for x in runs) for k in ("minutes", "job_peak_mib", "engine_peak_mib")
        }
        ref = f"{a.baseline_commit}:{key}" if a.baseline_commit and ":" not in key else first
        base = {k: statistics.median(x[k] for x in results[ref]) for k in med}
        summary[key] = med | {f"{k}_ratio": round(med[k] / base[k], 3) for k in ("minutes", "job_peak_mib")}
    print(json.dumps({"summary": summary, "commit": short_commit(ROOT), "load_after": os.getloadavg()}))


if __name__ == "__main__":
    main()
