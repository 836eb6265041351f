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
        grown by TRIM_GROWTH_BYTES; ``bf16_trimming@128`` at 128 MiB of growth
    bf16_two_passes: as bf16_trimming with micro_batch_tokens 1024, so the step's two groups (920
        forward tokens each) take two micro-batches, the second backpropagated beside the first's
        gradients: what a quickstart step of over 2,048 forward tokens did with micro_batch_tokens 2048
    bf16_one_pass: as bf16_trimming with micro_batch_tokens 4096 (the quickstart now: its steps of
        1,800-2,200 forward tokens take one micro-batch)
    varying@N: as bf16_one_pass, but each step's prompt 13 tokens longer than the last (a job's steps
        differ in length) and oneDNN's primitive cache capped at N primitives (1024 is oneDNN's
        default; the trainer loop sets ``pqrl.heap.KERNEL_CACHE_CAPACITY``, ``bound_kernel_cache``);
        ``rss_by_step`` shows whether the resident set after each step keeps growing

    python bench/trainer_memory.py [--rounds 1] [--steps 2] [--configs before,after] [--baseline-commit C]

Prints one JSON line per run, then a last line: per configuration the medians and the ratios to
the first configuration named (peak_rss_ratio, step_s_ratio). With ``--baseline-commit C`` every
configuration also runs on commit C's code (a git worktree; ``C:name`` in the output), alternated
with this tree's in each round, and the ratios are this tree's to C's for the same configuration.
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

from bench.checkout import worktree  # noqa: E402
from bench.learning import short_commit  # noqa: E402

_AFTER = {"micro_batch_tokens": 2048, "share_prefix": True, "gc": True, "chunk": 512}
_TRIMMING = {"heap": "trimming", **_AFTER, "bf16": True, "fused": True}
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
    "bf16_trimming": _TRIMMING,
    "bf16_two_passes": {**_TRIMMING, "micro_batch_tokens": 1024},
    "bf16_one_pass": {**_TRIMMING, "micro_batch_tokens": 4096},
    "varying": {**_TRIMMING, "micro_batch_tokens": 4096, "vary": True},
}
PROMPT, TURNS, GROUPS, G = 400, ((30, 15), (20, 0)), 2, 8


def _vm(key: str) -> int:
    """A /proc/self/status figure in MiB."""
    status = Path("/proc/self/status").read_text().splitlines()
    line = next(x for x in status if x.startswith(key + ":"))
    return int(line.split()[1]) // 1024


def _groups(step: int, prompt: int = PROMPT) -> list:
    import numpy as np

    from tests.conftest import make_trajectory

    out = []
    for g in range(GROUPS):
        group = []
        for i in range(G):
            t = make_trajectory(group_id=f"s{step}g{g}", index=i, prompt_len=prompt, turn_lens=TURNS,
                                seed=1000 * step + 10 * g + i, reward=float(i % 2))  # fmt: skip
            tokens = t.tokens.copy()
            if group:  # one prompt per group, as in a real group
                tokens[:prompt] = group[0].tokens[:prompt]
            versions = np.where(t.generated == 1, 0, -1).astype(np.int32)
            group.append(dataclasses.replace(t, tokens=tokens, versions=versions, truncation=None))
        out.append(group)
    return out


def _config(name: str) -> dict:
    """``name``'s settings; ``name@M`` is a trimming configuration trimming at M MiB of growth, or
    for ``varying`` one whose kernel cache holds M primitives."""
    base, _, growth = name.partition("@")
    conf = dict(CONFIGS[base])
    if conf.get("vary"):
        conf["kernel_cache"] = int(growth or 1024)
    elif growth:
        if conf["heap"] != "trimming":
            raise ValueError(f"{name}: only a trimming configuration takes @MiB")
        conf["trim_growth_mb"] = int(growth)
    return conf


def child(name: str, steps: int, code: Path) -> dict:
    """One configuration in this (fresh) process, the trainer's code imported from ``code``."""
    sys.path.insert(0, str(code))
    conf = _config(name)
    if "kernel_cache" in conf:  # read by oneDNN at its first primitive
        os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(conf["kernel_cache"])
    if conf["heap"] is True:
        from pqrl.heap import fix_mmap_threshold

        assert fix_mmap_threshold(int(os.environ.get("BENCH_MMAP_THRESHOLD", 1 << 20)))
    import torch

    from pqrl.heap import TRIM_GROWTH_BYTES, trim, trimming
    from pqrl.model_cache import load_model
    from trainer.config import StepConfig
    from trainer.optim import adamw
    from trainer.step import train_step

    assert Path(sys.modules[train_step.__module__].__file__).resolve().is_relative_to(code.resolve()), code
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = load_model(dtype=torch.float32)
    make = adamw if conf.get("fused") else torch.optim.AdamW  # torch's own AdamW: the earlier configs
    optimizer = make(model.parameters(), lr=2e-5)
    growth_mb = conf.get("trim_growth_mb", TRIM_GROWTH_BYTES >> 20)
    cfg = StepConfig(temperature=0.7, max_staleness=1, micro_batch_tokens=conf["micro_batch_tokens"],
                     share_prefix=conf["share_prefix"], gradient_checkpointing=conf["gc"],
                     logprob_chunk_tokens=conf["chunk"], cpu_autocast=conf.get("bf16", False))  # fmt: skip
    step_s, forward_tokens, rss_by_step = [], 0.0, []
    pool = ThreadPoolExecutor(1)  # the job trains in a worker thread (its own malloc arena) too
    for s in range(steps):
        t0 = time.perf_counter()
        with trimming(growth_mb << 20) if conf["heap"] == "trimming" else contextlib.nullcontext():
            groups = _groups(s, PROMPT + 13 * s if conf.get("vary") else PROMPT)
            m = pool.submit(train_step, model, optimizer, groups, version=0, cfg=cfg).result()
        if conf["heap"] == "trim":
            trim()
        step_s.append(time.perf_counter() - t0)
        forward_tokens, rss_by_step = m["perf/forward_tokens"], [*rss_by_step, _vm("VmRSS")]
    trimmed = {"trim_growth_mb": growth_mb} if conf["heap"] == "trimming" else {}
    return {"config": name, **conf, **trimmed, "step_s": step_s, "forward_tokens": forward_tokens,
            "peak_rss_mb": _vm("VmHWM"), "rss_mb": _vm("VmRSS"), "rss_by_step": rss_by_step}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--configs", default="before,heap,shared,after")
    ap.add_argument("--baseline-commit", help="also run every configuration on this commit's code")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--code", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.steps, Path(a.code or ROOT))), flush=True)
        return
    names = a.configs.split(",")
    try:
        [_config(n) for n in names]
    except (KeyError, ValueError):
        ap.error(f"--configs: a comma-separated subset of {list(CONFIGS)}; ratios are to the first")
    commit = short_commit(ROOT)
    print(f"# {' '.join(sys.argv)}; commit {commit}; load {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores",
          flush=True)  # fmt: skip
    with worktree(a.baseline_commit) as base:
        trees = [(ROOT, "")] + ([(base, f"{a.baseline_commit}:")] if a.baseline_commit else [])
        runs: dict[str, list[dict]] = {t + n: [] for n in names for _, t in trees}
        for r in range(a.rounds):
            for n in names:
                for tree, tag in trees if r % 2 == 0 else trees[::-1]:
                    print(f"# round {r + 1}/{a.rounds}: {tag}{n}", file=sys.stderr, flush=True)
                    runs[tag + n].append(_run_child(tree, n, a.steps))
                    print(json.dumps({"tree": tag or commit, **runs[tag + n][-1]}), flush=True)
    summary = {}
    for key, rs in runs.items():
        summary[key] = {
            "peak_rss_mb": statistics.median(x["peak_rss_mb"] for x in rs),
            "step_s": statistics.median(statistics.mean(x["step_s"]) for x in rs),
            "forward_tokens": rs[-1]["forward_tokens"],
        }
    for key in runs:
        ref = f"{a.baseline_commit}:{key}" if a.baseline_commit else names[0]
        if ref in summary:
            summary[key]["peak_rss_ratio"] = summary[key]["peak_rss_mb"] / summary[ref]["peak_rss_mb"]
            summary[key]["step_s_ratio"] = summary[key]["step_s"] / summary[ref]["step_s"]
    print(json.dumps({"load_end": round(os.getloadavg()[0], 2), **summary}))


def _run_child(tree: Path, name: str, steps: int) -> dict:
    """One configuration in a fresh process: this bench, the trainer's code from ``tree``."""
    cmd = [sys.executable, __file__, "--child", name, "--steps", str(steps), "--code", str(tree)]
    proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                          cwd=tree)  # fmt: skip
    if proc.returncode:
        sys.exit(f"{name} failed in {tree}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
