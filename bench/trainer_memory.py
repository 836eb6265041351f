"""The trainer's peak memory and step time on the CPU quickstart's shape, before and after the
memory work, each configuration in a fresh process, alternated over rounds in one run.

Shape: 2 groups x 8 episodes of SmolLM2-135M-Instruct, each a shared 400-token prompt (the
quickstart's two worked examples) then two turns (30 generated + 15 tool tokens, 20 generated):
465 tokens, 50 trained. Tokens are random (time and memory do not depend on them). AdamW, one
torch thread as the quickstart's trainer has, the step in a worker thread as the job runs it.
Peak memory is the process's VmHWM after ``--steps`` steps (the second step is the first with
AdamW's states beside a backward).

Configurations (``name: heap, micro_batch_tokens, share_prefix, gradient_checkpointing,
logprob_chunk_tokens``):
    before:   glibc default, 2048, off, off, 2048   (the quickstart before this work)
    heap:     fixed mmap threshold, 2048, off, off, 2048
    shared:   fixed mmap threshold, 2048, on,  off, 2048
    after:    fixed mmap threshold, 2048, on,  on,  512    (the quickstart now)
    after_glibc: glibc default, 2048, on, on, 512
    after_trim: glibc default plus malloc_trim after each step, 2048, on, on, 512
    bf16_trim: as after_trim, under bfloat16 autocast (``model.dtype: bfloat16``)
    bf16_no_ckpt: as bf16_trim, without gradient checkpointing
    bf16_compact: as after (``train.compact_memory: true``), under bfloat16 autocast
    bf16_fused: as bf16_trim, with the fused AdamW (``trainer.optim.adamw``)
    bf16_trimming: as bf16_fused, also trimming while the step runs, whenever the resident set has
        grown by TRIM_GROWTH_BYTES (the quickstart now); ``bf16_trimming@128`` at 128 MiB of growth

    python bench/trainer_memory.py [--rounds 1] [--steps 2] [--configs before,after]

Prints one JSON line per run, then a last line: per configuration the medians and the ratios to
the first configuration named (peak_rss_ratio, step_s_ratio).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # before bench/, whose engine.py would shadow the engine package

from bench.learning import short_commit  # noqa: E402

_AFTER = {"micro_batch_tokens": 2048, "share_prefix": True, "gc": True, "chunk": 512}
CONFIGS = {
    "before": {"heap": False, "micro_batch_tokens": 2048, "share_prefix": False, "gc": False, "chunk": 2048},
    "heap": {"heap": True, "micro_batch_tokens": 2048, "share_prefix": False, "gc": False, "chunk": 2048},
    "shared": {"heap": True, "micro_batch_tokens": 2048, "share_prefix": True, "gc": False, "chunk": 2048},
    "after": {"heap": True, **_AFTER},
    "after_glibc": {"heap": False, **_AFTER},
    "after_trim": {"heap": "trim", **_AFTER},
    "bf16_trim": {"heap": "trim", **_AFTER, "bf16": True},
    "bf16_no_ckpt": {"heap": "trim", **_AFTER, "gc": False, "bf16": True},
    "bf16_compact": {"heap": True, **_AFTER, "bf16": True},
    "bf16_fused": {"heap": "trim", **_AFTER, "bf16": True, "fused": True},
    "bf16_trimming": {"heap": "trimming", **_AFTER, "bf16": True, "fused": True},
}
PROMPT, TURNS, GROUPS, G = 400, ((30, 15), (20, 0)), 2, 8


def _vm(key: str) -> int:
    """A /proc/self/status figure in MiB."""
    status = Path("/proc/self/status").read_text().splitlines()
    line = next(x for x in status if x.startswith(key + ":"))
    return int(line.split()[1]) // 1024


def _groups(step: int) -> list:
    import numpy as np

    from tests.conftest import make_trajectory

    out = []
    for g in range(GROUPS):
        group = []
        for i in range(G):
            t = make_trajectory(group_id=f"s{step}g{g}", index=i, prompt_len=PROMPT, turn_lens=TURNS,
                                seed=1000 * step + 10 * g + i, reward=float(i % 2))  # fmt: skip
            tokens = t.tokens.copy()
            if group:  # one prompt per group, as in a real group
                tokens[:PROMPT] = group[0].tokens[:PROMPT]
            versions = np.where(t.generated == 1, 0, -1).astype(np.int32)
            group.append(dataclasses.replace(t, tokens=tokens, versions=versions, truncation=None))
        out.append(group)
    return out


def _config(name: str) -> dict:
    """``name``'s settings; ``name@M`` is a trimming configuration trimming at M MiB of growth."""
    base, _, growth = name.partition("@")
    conf = dict(CONFIGS[base])
    if growth:
        if conf["heap"] != "trimming":
            raise ValueError(f"{name}: only a trimming configuration takes @MiB")
        conf["trim_growth_mb"] = int(growth)
    return conf


def child(name: str, steps: int) -> dict:
    """One configuration in this (fresh) process."""
    conf = _config(name)
    if conf["heap"] is True:
        from pqrl.heap import fix_mmap_threshold

        assert fix_mmap_threshold(int(os.environ.get("BENCH_MMAP_THRESHOLD", 1 << 20)))
    import torch

    from pqrl.heap import TRIM_GROWTH_BYTES, trim, trimming
    from pqrl.model_cache import load_model
    from trainer.config import StepConfig
    from trainer.optim import adamw
    from trainer.step import train_step

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = load_model(dtype=torch.float32)
    make = adamw if conf.get("fused") else torch.optim.AdamW  # torch's own AdamW: the earlier configs
    optimizer = make(model.parameters(), lr=2e-5)
    growth_mb = conf.get("trim_growth_mb", TRIM_GROWTH_BYTES >> 20)
    cfg = StepConfig(temperature=0.7, max_staleness=1, micro_batch_tokens=conf["micro_batch_tokens"],
                     share_prefix=conf["share_prefix"], gradient_checkpointing=conf["gc"],
                     logprob_chunk_tokens=conf["chunk"], cpu_autocast=conf.get("bf16", False))  # fmt: skip
    step_s, forward_tokens = [], 0.0
    pool = ThreadPoolExecutor(1)  # the job trains in a worker thread (its own malloc arena) too
    for s in range(steps):
        t0 = time.perf_counter()
        with trimming(growth_mb << 20) if conf["heap"] == "trimming" else contextlib.nullcontext():
            m = pool.submit(train_step, model, optimizer, _groups(s), version=0, cfg=cfg).result()
        if conf["heap"] == "trim":
            trim()
        step_s.append(time.perf_counter() - t0)
        forward_tokens = m["perf/forward_tokens"]
    trimmed = {"trim_growth_mb": growth_mb} if conf["heap"] == "trimming" else {}
    return {"config": name, **conf, **trimmed, "step_s": step_s, "forward_tokens": forward_tokens,
            "peak_rss_mb": _vm("VmHWM"), "rss_mb": _vm("VmRSS")}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--configs", default="before,heap,shared,after")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.steps)), flush=True)
        return
    names = a.configs.split(",")
    try:
        [_config(n) for n in names]
    except (KeyError, ValueError):
        ap.error(f"--configs: a comma-separated subset of {list(CONFIGS)}; ratios are to the first")
    commit = short_commit(ROOT)
    print(f"# {' '.join(sys.argv)}; commit {commit}; load {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores",
          flush=True)  # fmt: skip
    runs: dict[str, list[dict]] = {n: [] for n in names}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for r in range(a.rounds):
        for n in names:
            print(f"# round {r + 1}/{a.rounds}: {n}", file=sys.stderr, flush=True)
            proc = subprocess.run([sys.executable, __file__, "--child", n, "--steps", str(a.steps)], env=env,
                                  capture_output=True, text=True, cwd=ROOT)  # fmt: skip
            if proc.returncode:
                sys.exit(f"{n} failed:\n{proc.stderr[-3000:]}")
            out = proc.stdout
            runs[n].append(json.loads(out.strip().splitlines()[-1]))
            print(json.dumps(runs[n][-1]), flush=True)
    summary = {}
    for n, rs in runs.items():
        summary[n] = {
            "peak_rss_mb": statistics.median(x["peak_rss_mb"] for x in rs),
            "step_s": statistics.median(statistics.mean(x["step_s"]) for x in rs),
            "forward_tokens": rs[-1]["forward_tokens"],
        }
    for n in names:
        summary[n]["peak_rss_ratio"] = summary[n]["peak_rss_mb"] / summary[names[0]]["peak_rss_mb"]
        summary[n]["step_s_ratio"] = summary[n]["step_s"] / summary[names[0]]["step_s"]
    print(json.dumps({"load_end": round(os.getloadavg()[0], 2), **summary}))


if __name__ == "__main__":
    main()
