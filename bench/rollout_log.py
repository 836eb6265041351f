"""What the rollout log costs on the quickstart's shape: the writer's time per step against the
step's, and bytes per trajectory.

Runs ``pqrl train examples/quickstart.yaml`` (no evaluation, ``--steps`` steps) into a temporary
directory with the log on, then reads back what it wrote: per step the file's bytes and rows and the
trainer's ``perf/step_s`` and wall time between steps (``metrics.jsonl``). The writer's own time is
measured on those same trajectories: each step's rows are rebuilt as Trajectory records (with the
trainer's logprobs and advantages) and written again by ``trainer.rollout_log.RolloutLog`` on its
thread, ``--repeats`` times, the median kept. The write runs beside the step (off its critical
section), so on a machine with a free core it costs the step nothing; on a busy one at most this.

    python bench/rollout_log.py [--steps 3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _records(table) -> tuple[list[list], dict, int]:
    """The groups of one step file as Trajectory records, the trainer's numbers, the version."""
    import numpy as np

    from pqrl.trajectory import ToolCall, Trajectory, Truncation, Turn

    groups: dict[str, list] = {}
    record: dict[str, dict] = {}
    version = 0
    for r in table.to_pylist():
        version = r["policy_version"]
        turns = tuple(
            Turn(u["start"], u["end"], u["finish_reason"], tuple(ToolCall(**c) for c in u["tool_calls"]))
            for u in json.loads(r["turns"])
        )
        cut = json.loads(r["truncation"]) if r["truncation"] else None
        t = Trajectory(
            id=r["id"], run_id=r["run_id"], task_id=r["task_id"], group_id=r["group_id"], env=r["env"],
            tokens=np.array(r["tokens"], np.int32), generated=np.array(r["generated"], np.uint8),
            loss_mask=np.array(r["loss_mask"], np.uint8),
            behavior_logprobs=np.array(r["behavior_logprobs"], np.float32),
            versions=np.array(r["versions"], np.int32), prompt_len=r["prompt_len"], turns=turns,
            reward=r["reward"], reward_info=json.loads(r["reward_info"]), status=r["status"],
            truncation=None if cut is None else Truncation(cut["kind"], cut["at_token"], cut["detail"]),
            timings=json.loads(r["timings"]),
        )  # fmt: skip
        groups.setdefault(t.group_id, []).append(t)
        if r["trainer_logprobs"] is not None:
            lp = np.array(r["trainer_logprobs"], np.float32)
            pos = np.flatnonzero(~np.isnan(lp))
            record[t.id] = {"positions": pos, "logprobs": lp[pos], "advantage": r["advantage"]}
    return list(groups.values()), record, version


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="keep the job's run directory")
    args = ap.parse_args()
    import pyarrow.parquet as pq

    from launcher.jobconfig import load_config, step_config
    from trainer.rollout_log import RolloutLog, step_file

    out = Path(tempfile.mkdtemp(prefix="rollout-log-bench-"))
    sets = [f"train.steps={args.steps}", "eval.suite=null", f"output_dir={out}"]
    job = str(ROOT / "examples" / "quickstart.yaml")
    cmd = [sys.executable, "-m", "launcher.cli", "train", job, "--fresh", "--quiet",
           *[x for s in sets for x in ("--set", s)]]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"the job failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(json.dumps({"job": " ".join(cmd[1:]), "wall_min": round((time.monotonic() - t0) / 60, 2)}))
    run = out / "quickstart"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "perf/step_s" in m]
    cfg = step_config(load_config(run / "config.yaml"))
    rewrite = RolloutLog(out / "rewrite")
    rows, totals = [], {"bytes": 0, "trajectories": 0, "tokens": 0}
    prev_time = None
    for m in steps:
        path = step_file(run / "rollouts", m["step"])
        table = pq.read_table(path)
        groups, record, version = _records(table)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            rewrite.submit(m["step"], version, groups, cfg, record)
            rewrite.flush()
            times.append(time.perf_counter() - start)
        size, n = path.stat().st_size, table.num_rows
        tokens = sum(len(x) for x in table.column("tokens").to_pylist())
        totals["bytes"] += size
        totals["trajectories"] += n
        totals["tokens"] += tokens
        wall = None if prev_time is None else m["time"] - prev_time
        prev_time = m["time"]
        rows.append({
            "step": m["step"], "trajectories": n, "tokens": tokens, "file_bytes": size,
            "bytes_per_trajectory": round(size / n), "writer_s": round(statistics.median(times), 4),
            "step_s": round(m["perf/step_s"], 2),
            "wall_between_steps_s": None if wall is None else round(wall, 1),
            "writer_over_step": round(statistics.median(times) / m["perf/step_s"], 5),
        })  # fmt: skip
        print(json.dumps(rows[-1]))
    rewrite.close()
    print(json.dumps({
        "summary": True, "steps": len(rows),
        "writer_s_median": statistics.median(r["writer_s"] for r in rows),
        "step_s_median": statistics.median(r["step_s"] for r in rows),
        "writer_over_step_median": statistics.median(r["writer_over_step"] for r in rows),
        "bytes_per_trajectory": round(totals["bytes"] / totals["trajectories"]),
        "bytes_per_token": round(totals["bytes"] / totals["tokens"], 2),
        "vocab_json_bytes": (run / "rollouts" / "vocab.json").stat().st_size,
    }))  # fmt: skip
    if not args.keep:
        import shutil

        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
