"""One GRPO step, split into its parts: generate, train, weight sync; synchronous and overlapped.

Shape (the quickstart's, single-turn): SmolLM2-135M-Instruct, 2 calc prompts (the quickstart's
suite, two worked examples in each prompt) x 8 completions of at most 48 tokens at T 0.7, one turn.
Everything real: the built-in engine as its own process over HTTP (``--engine-threads``), the agent
loop and the calc environment, ``train_step`` with the quickstart's step settings in this process
(``--trainer-threads``), and the quickstart's weight sync (checkpoint + ``/update_weights_from_disk``,
through /dev/shm as an embedded job does when it has room; ``--weights-dir`` to put them elsewhere).
Rewards are set to 0/1 alternately within each group, so every group is trained (the time of a step
does not depend on which episodes earned what).

    sync:  generate 2 groups, then train on them, then push the weights; ``--steps`` times.
    async: the next step's groups are generated while this step trains and pushes (one version of
           staleness, the quickstart's ``max_staleness``); the mean time per step (``--sync-only``: not run).

The variants named by ``--variants`` run in the same run, one after the other, the first being the
baseline (its engine served from ``--baseline-engine-commit``'s checkout when given, so one variant
twice compares two engines):

    no_sharing    the engine's prefix sharing off (``--prefix-cache-tokens 0``: every prompt prefilled
                  in full), the trainer in float32
    sharing       prefix sharing on (the engine's default), the trainer in float32 (the default on CPU)
    sharing_bf16  prefix sharing on, the trainer under bfloat16 autocast (``model.dtype: bfloat16``)
    bf16_no_ckpt  as sharing_bf16, without gradient checkpointing
    bf16_matmul   as sharing_bf16, the engine multiplying in bfloat16 too (``--matmul-dtype
                  bfloat16``, what an embedded job with ``model.dtype: bfloat16`` runs)

Prints one JSON line per variant (with the engine's own time in prefills and decode steps over the
whole run, ``engine_prefill_s`` and ``engine_decode_s``, and ``decode_step_s`` at ``decode_mean_rows``
rows, when its engine reports them, and the trainer's mean ``mismatch_kl``: how far the engine's
sampling probabilities are from the trainer's on the same weights), then the last line: the last
variant's ``sync_step_s``, ``async_step_s``, ``generate_s``, ``train_s``, ``weight_sync_s``,
``generate_tok_s``, with the ratios of the baseline to it.

    python bench/grpo_step.py [--steps 3] [--engine-threads 1] [--trainer-threads 1]
                              [--variants no_sharing,sharing] [--weights-dir DIR] [--sync-only]
                              [--baseline-engine-commit C]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # before bench/, whose engine.py would shadow the engine package
from bench.checkout import worktree  # noqa: E402
from bench.learning import short_commit  # noqa: E402

GROUPS, G = 2, 8
# name: (engine prefix-cache tokens, more engine flags, step settings replaced)
VARIANTS: dict[str, tuple[int, tuple[str, ...], dict[str, Any]]] = {
    "no_sharing": (0, (), {"cpu_autocast": False}),
    "sharing": (16384, (), {"cpu_autocast": False}),
    "sharing_bf16": (16384, (), {"cpu_autocast": True}),
    "bf16_no_ckpt": (16384, (), {"cpu_autocast": True, "gradient_checkpointing": False}),
    "bf16_matmul": (16384, ("--matmul-dtype", "bfloat16"), {"cpu_autocast": True}),
}


def _engine(
    port: int, threads: int, cache_tokens: int, flags: tuple[str, ...], root: Path
) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONPATH": str(root),
    }
    cmd = [sys.executable, "-m", "launcher.cli", "engine", "serve", "--backend", "builtin",
           "--port", str(port), "--seed", "0", "--prefix-cache-tokens", str(cache_tokens)]  # fmt: skip
    cmd += flags
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _default_weights_parent() -> str | None:
    """/dev/shm when it holds three copies of the model (the quickstart's choice), else the temp dir."""
    from launcher.ram_weights import ram_weights_dir

    return "/dev/shm" if ram_weights_dir(ROOT, 540_000_000, keep=2) is not None else None


class Step:
    """The parts of one step, on one engine and one trainer."""

    def __init__(
        self, cfg: Any, engine: Any, model: Any, tokenizer: Any, weights_dir: str, step: dict[str, Any]
    ) -> None:
        from agent_loop.agent import EpisodeConfig
        from env_server.client import LocalEnvClient
        from launcher.jobconfig import episode_config, step_config
        from loss_masking import ChatRenderer
        from trainer.optim import adamw
        from trainer.weight_sync import DiskWeightSync

        self.suite = cfg.tasks.suites[0].build()
        self.engine, self.model = engine, model
        self.env = LocalEnvClient()
        self.renderer = ChatRenderer(tokenizer)
        self.episode: EpisodeConfig = dataclasses.replace(episode_config(cfg), max_turns=1)
        self.step_cfg = dataclasses.replace(step_config(cfg), **step)
        self.optimizer = adamw(model.parameters(), lr=cfg.train.lr)
        self.sync = DiskWeightSync(engine, weights_dir)
        self.version = 0
        self.next_task = 0
        self.mismatch_kl: list[float] = []  # the trainer's offpolicy/mismatch_kl, a step each

    async def generate(self) -> tuple[list[list[Any]], float, int]:
        """``GROUPS`` groups of ``G`` episodes; their seconds and generated tokens."""
        from agent_loop.agent import run_episode
        from tasks.storage import queued_task

        first, self.next_task = self.next_task, self.next_task + GROUPS
        t0 = time.perf_counter()
        done = await asyncio.gather(*(
            run_episode(queued_task(self.suite, k), engine=self.engine, env=self.env, renderer=self.renderer,
                        run_id="bench", group_id=f"g{k}", index=i, cfg=self.episode)
            for k in range(first, first + GROUPS) for i in range(G)
        ))  # fmt: skip
        took = time.perf_counter() - t0
        groups = [[dataclasses.replace(t, reward=float(i % 2)) for i, t in enumerate(done[g * G:(g + 1) * G])]
                  for g in range(GROUPS)]  # fmt: skip
        return groups, took, sum(t.num_generated for t in done)

    async def train(self, groups: list[list[Any]]) -> float:
        from trainer.step import train_step

        t0 = time.perf_counter()
        metrics = await asyncio.to_thread(
            train_step, self.model, self.optimizer, groups, self.version, self.step_cfg
        )
        if metrics.get("rollout/trajectories_used", 0) != GROUPS * G:
            raise SystemExit(f"the step did not train every episode: {metrics}")
        self.mismatch_kl.append(metrics["offpolicy/mismatch_kl"])
        return time.perf_counter() - t0

    async def push(self) -> float:
        t0 = time.perf_counter()
        self.version += 1
        await self.sync.push(self.model, self.version)
        return time.perf_counter() - t0


async def _overlapped(step: Step, steps: int) -> float:
    """Mean seconds a step when the next step's groups are generated while this one trains."""
    t0 = time.perf_counter()
    pending = asyncio.ensure_future(step.generate())
    for s in range(steps):
        groups = (await pending)[0]
        if s + 1 < steps:
            pending = asyncio.ensure_future(step.generate())
        await step.train(groups)
        await step.push()
    return round((time.perf_counter() - t0) / steps, 2)


async def _variant(args: argparse.Namespace, name: str, engine_root: Path) -> dict[str, Any]:
    import torch

    from engine.client import EngineClient
    from launcher.jobconfig import load_config
    from pqrl.model_cache import load_model, load_tokenizer
    from pqrl.redis_server import free_port

    cache_tokens, engine_flags, step_settings = VARIANTS[name]
    cfg = load_config(ROOT / "examples" / "quickstart.yaml")
    torch.set_num_threads(args.trainer_threads)
    torch.manual_seed(0)
    port = free_port()
    proc = _engine(port, args.engine_threads, cache_tokens, engine_flags, engine_root)
    url = f"http://127.0.0.1:{port}"
    try:
        async with EngineClient(url) as engine:
            await engine.wait_until_healthy(timeout_s=300)
            model = load_model(cfg.model.name, dtype=torch.float32)
            with tempfile.TemporaryDirectory(dir=args.weights_dir) as weights:
                step = Step(cfg, engine, model, load_tokenizer(cfg.model.name), weights, step_settings)
                await step.train((await step.generate())[0])  # warm-up: allocator, threads, optimizer state
                await step.push()
                gen, train, push, tok = [], [], [], 0
                for _ in range(args.steps):  # synchronous
                    groups, g_s, n = await step.generate()
                    gen.append(g_s)
                    tok += n
                    train.append(await step.train(groups))
                    push.append(await step.push())
                async_step_s = None if args.sync_only else await _overlapped(step, args.steps)
        stats = httpx.get(f"{url}/engine_stats", timeout=30).json()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    sync = [a + b + c for a, b, c in zip(gen, train, push, strict=True)]
    return {
        "variant": name,
        **{k: getattr(step.step_cfg, k) for k in ("cpu_autocast", "gradient_checkpointing")},
        "sync_step_s": round(statistics.median(sync), 2),
        "async_step_s": async_step_s,
        "generate_s": round(statistics.median(gen), 2),
        "train_s": round(statistics.median(train), 2),
        "weight_sync_s": round(statistics.median(push), 2),
        "generate_tok_s": round(tok / sum(gen), 1),
        "generated_tokens_per_step": round(tok / args.steps, 1),
        # engine vs trainer on the same weights, over every step trained (warm-up included)
        "mismatch_kl": round(statistics.mean(step.mismatch_kl), 5),
        "engine_prompt_tokens": stats.get("prompt_tokens"),
        "engine_prefill_tokens": stats.get("prefill_tokens"),
        # engine-side wall time over the whole run (warm-up, sync and async steps); absent before it existed
        **{f"engine_{k}": round(stats[k], 2) for k in ("prefill_s", "decode_s") if k in stats},
        **(
            {
                "decode_step_s": round(stats["decode_s"] / stats["decode_steps"], 4),
                "decode_mean_rows": round(stats["decode_rows"] / stats["decode_steps"], 1),
            }
            if stats.get("decode_steps") and "decode_s" in stats
            else {}
        ),  # fmt: skip
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--engine-threads", type=int, default=1)
    ap.add_argument("--trainer-threads", type=int, default=1)
    ap.add_argument(
        "--weights-dir",
        default=_default_weights_parent(),
        help="where each push's checkpoint is written (default: RAM, as the quickstart)",
    )
    ap.add_argument("--sync-only", action="store_true", help="skip the overlapped steps")
    ap.add_argument("--baseline-engine-commit", help="serve the first variant's engine from this commit")
    ap.add_argument("--variants", default="no_sharing,sharing", help=f"comma-separated: {sorted(VARIANTS)}")
    args = ap.parse_args()
    names = args.variants.split(",")
    if len(names) < 2 or not set(names) <= set(VARIANTS):
        ap.error(f"--variants needs two or more of {sorted(VARIANTS)}, got {args.variants!r}")
    results = []
    with worktree(args.baseline_engine_commit) as old_root:
        for k, name in enumerate(names):
            root = old_root if k == 0 else ROOT
            results.append(asyncio.run(_variant(args, name, root)) | {"engine_commit": short_commit(root)})
            print(json.dumps(results[-1]), flush=True)
    old, new = results[0], results[-1]
    keys = ("sync_step_s", "async_step_s", "generate_s", "train_s", "weight_sync_s", "generate_tok_s")
    keys = tuple(k for k in keys if new[k] is not None)
    ratios = {f"{k}_ratio_{old['variant']}": round(old[k] / new[k], 2) for k in keys}
    print(json.dumps({"variant": new["variant"]} | {k: new[k] for k in keys} | ratios
                     | {"steps": args.steps, "engine_threads": args.engine_threads,
                        "trainer_threads": args.trainer_threads,
                        "weights_dir": args.weights_dir}))  # fmt: skip


if __name__ == "__main__":
    main()
