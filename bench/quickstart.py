"""The quickstart job end to end, variants alternated in one run: wall minutes, eval after, and the
peak resident memory of the job process (trainer, rollout manager, evaluation) and of the engine.

Each run is ``pqrl train examples/quickstart.yaml --fresh --quiet`` plus the variant's ``--set``
overrides; a poller reads ``VmHWM`` of the job process and of every process under it every 0.5 s
(the engine is a child; its largest is reported). Per step it reads the run's metrics file.

    python bench/quickstart.py --variants "stream=,batch=train.stream=false" [--rounds 1]

A variant is ``name=`` followed by comma-free ``field=value`` overrides joined by ``+``. Prints one
JSON line per run, then a summary: per variant the medians and the ratios to the first variant.
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

from bench.learning import short_commit  # noqa: E402


def _hwm_mib(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0
    line = next((x for x in status if x.startswith("VmHWM:")), "VmHWM: 0 kB")
    return int(line.split()[1]) // 1024


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


def run(name: str, overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "launcher.cli", "train", "examples/quickstart.yaml", "--fresh", "--quiet"]
    for o in overrides:
        cmd += ["--set", o]
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)}
    )
    job, engine = 0, 0
    while proc.poll() is None:
        job = max(job, _hwm_mib(proc.pid))
        engine = max([engine, *map(_hwm_mib, _children(proc.pid))])
        time.sleep(0.5)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode:
        raise SystemExit(f"{name}: the job failed (rc {proc.returncode}): {out[-2000:]}")
    summary = json.loads(out.strip().splitlines()[-1])
    steps = []
    for line in (ROOT / summary["metrics"]).read_text().splitlines():
        m = json.loads(line)
        if "perf/step_s" in m:
            steps.append(
                {k: m.get(k) for k in ("step", "perf/forward_tokens", "perf/micro_batches", "perf/step_s")}
            )
    return {"variant": name, "overrides": overrides, "minutes": summary["minutes"],
            "wall_minutes": round((time.time() - t0) / 60, 2), "eval_after": summary["eval_after"],
            "job_peak_mib": job, "engine_peak_mib": engine, "steps": steps}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="default=", help='"name=f=v+f=v,name2=..."')
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    variants = {}
    for spec in a.variants.split(","):
        name, _, sets = spec.partition("=")
        variants[name] = [s for s in sets.split("+") if s]
    print(f"# commit {short_commit(ROOT)}, load {os.getloadavg()}", file=sys.stderr)
    results: dict[str, list[dict]] = {n: [] for n in variants}
    for r in range(a.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            res = run(name, variants[name])
            results[name].append(res)
            print(json.dumps(res), flush=True)
    first = next(iter(variants))
    summary = {}
    for name, runs in results.items():
        med = {
            k: statistics.median(x[k] for x in runs) for k in ("minutes", "job_peak_mib", "engine_peak_mib")
        }
        base = {k: statistics.median(x[k] for x in results[first]) for k in med}
        summary[name] = med | {f"{k}_ratio": round(med[k] / base[k], 3) for k in ("minutes", "job_peak_mib")}
    print(json.dumps({"summary": summary, "commit": short_commit(ROOT), "load_after": os.getloadavg()}))


if __name__ == "__main__":
    main()
