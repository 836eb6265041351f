"""LoRA against full fine-tuning on the CPU quickstart's shape: weight-sync bytes and seconds, the
trainer's step time and peak memory.

Shape: ``examples/quickstart.yaml`` (SmolLM2-135M-Instruct, 2 calc groups x 8 episodes, its step
settings), LoRA as ``examples/quickstart_lora.yaml`` sets it (rank 16 on the 7 projections). Each
variant runs in a fresh process (peak RSS is the process's VmHWM) with its own built-in engine
process over HTTP: it generates the 2 groups once with real episodes (rewards set 0/1 within each
group, so every episode trains), then ``--steps`` times trains on them (``train_step``, the optimizer
over the trained parameters only) and pushes the weights as an embedded job does
(``DiskWeightSync``: save, then ``/update_weights_from_disk``, returning once the engine serves
them; through /dev/shm when it has room). The first step is a warm-up (optimizer states, allocator)
and is left out of the medians.

    python bench/lora.py [--steps 3] [--variants full,lora,lora_merged]

``lora_merged`` is the LoRA run publishing whole weights with its adapter merged
(``model.lora.publish: merged``, what vLLM and SGLang engines are sent).

Prints one JSON line per variant (``train_s``, ``sync_s``, ``sync_bytes``, ``peak_rss_mib``,
``trained_params``), then the ratios of full fine-tuning to LoRA.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # before bench/, whose engine.py would shadow the engine package
from bench.grpo_step import Step, _default_weights_parent, _engine  # noqa: E402
from bench.learning import short_commit  # noqa: E402

# lora_merged: the same LoRA run publishing whole merged weights, as it does to vLLM or SGLang
CONFIGS = {"full": "quickstart.yaml", "lora": "quickstart_lora.yaml", "lora_merged": "quickstart_lora.yaml"}


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _one(variant: str, steps: int, weights_parent: str | None) -> dict[str, Any]:
    import torch

    from engine.client import EngineClient
    from launcher.jobconfig import load_config
    from pqrl.model_cache import load_model, load_tokenizer
    from pqrl.redis_server import free_port
    from trainer.lora import apply_lora
    from trainer.optim import adamw

    cfg = load_config(ROOT / "examples" / CONFIGS[variant])
    torch.set_num_threads(cfg.services.trainer_threads)
    torch.manual_seed(0)
    port = free_port()
    proc = _engine(port, cfg.services.engine_threads, 16384, (), ROOT)
    try:
        async with EngineClient(f"http://127.0.0.1:{port}") as engine:
            await engine.wait_until_healthy(timeout_s=600)
            model = load_model(cfg.model.name, dtype=torch.float32)
            if cfg.model.lora.enabled:
                model = apply_lora(model, cfg.model.lora, base=cfg.model.name)
            with tempfile.TemporaryDirectory(dir=weights_parent) as weights:
                # the same groups every step: keep them trainable however many versions pass
                step = Step(
                    cfg, engine, model, load_tokenizer(cfg.model.name), weights, {"max_staleness": 10**6}
                )
                step.sync.merged = variant == "lora_merged"
                trained = [p for p in model.parameters() if p.requires_grad]
                step.optimizer = adamw(trained, lr=cfg.train.lr)
                groups, gen_s, _ = await step.generate()
                train_s, sync_s, sync_bytes = [], [], []
                for _ in range(steps):
                    train_s.append(await step.train(groups))
                    sync_s.append(await step.push())
                    sync_bytes.append(_dir_bytes(Path(step.sync.location(step.version))))
            versions = await engine.get_weight_version()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert set(versions.values()) == {step.version}, f"the engine does not serve the last push: {versions}"
    return {
        "variant": variant,
        "trained_params": sum(p.numel() for p in trained),
        "train_s": round(statistics.median(train_s[1:] or train_s), 2),
        "sync_s": round(statistics.median(sync_s[1:] or sync_s), 3),
        "sync_bytes": statistics.median(sync_bytes),
        "peak_rss_mib": round(_peak_rss_mib(), 1),
        "train_s_all": [round(s, 2) for s in train_s],
        "sync_s_all": [round(s, 3) for s in sync_s],
        "generate_s": round(gen_s, 1),
        "mismatch_kl": round(statistics.mean(step.mismatch_kl), 6),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--steps", type=int, default=3, help="train + sync rounds per variant (the first is a warm-up)"
    )
    ap.add_argument("--variants", default="full,lora,lora_merged")
    ap.add_argument("--weights-dir", default=_default_weights_parent(), help="where pushes are written")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a variant, in this (fresh) process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(_one(args.one, args.steps, args.weights_dir))), flush=True)
        return
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    when = time.strftime("%F %H:%M UTC", time.gmtime())
    print(f"# python bench/lora.py {' '.join(sys.argv[1:])}   ({when}, commit {short_commit(ROOT)}, "
          f"{os.cpu_count()} CPUs, load at start {load})", flush=True)  # fmt: skip
    results = {}
    for name in args.variants.split(","):
        cmd = [sys.executable, __file__, "--one", name, "--steps", str(args.steps)]
        if args.weights_dir:
            cmd += ["--weights-dir", args.weights_dir]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(results[name]), flush=True)
    if {"full", "lora"} <= set(results):
        full, lora = results["full"], results["lora"]
        keys = ("train_s", "sync_s", "sync_bytes", "peak_rss_mib", "trained_params")
        print(json.dumps({f"{k}_full_over_lora": round(full[k] / lora[k], 2) for k in keys}))
    if {"lora", "lora_merged"} <= set(results):
        merged, lora = results["lora_merged"], results["lora"]
        print(
            json.dumps(
                {f"{k}_merged_over_adapter": round(merged[k] / lora[k], 2) for k in ("sync_s", "sync_bytes")}
            )
        )


if __name__ == "__main__":
    main()
