"""Trainer throughput on one GPU: pqrl's ``train_step`` against a plain transformers step, in one run.

Model: Qwen2-0.5B-shaped (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab
151936, tied embeddings), random init, float32 weights under bf16 autocast on CUDA, AdamW.
Batch: sequence lengths drawn uniformly from 256..4096 (fixed seed) until 16k real tokens per step,
as Trajectory records in groups of 4 (random tokens, the second half generated and trained,
behaviour logprobs about those of a random model, rewards alternating so advantages are nonzero).
Every step gets a new batch; both contenders see the same batches.

  pqrl:     ``trainer.step.train_step``: packed rows (no padding, per-sequence attention), fused
            chunked log-softmax/gather on the trained tokens only, bf16 autocast; measured eager
            and with the vocabulary math compiled (``--no-compile`` skips that), the faster counts.
  baseline: ``model(input_ids, attention_mask)`` on the same sequences padded to the longest, full
            float32 log_softmax + gather over all positions, the same loss
            (``trainer.objective.micro_batch_loss``; one epoch, so pi_prox is the detached policy
            in both), clip, ``torch.optim.AdamW``.

Only real tokens count (padding does not). After ``--warmup`` steps, ``--steps`` steps are timed
with the device synchronised. Model FLOPs utilisation, for per-step sequence lengths ``L_i``::

    MFU = tokens/s * (6 * P + 6 * n_layers * d_attn * sum(L_i^2) / sum(L_i)) / 790e12

``P`` the parameter count (tied embeddings once: the head matmul is real compute, the lookup is
not), ``d_attn`` = heads x head dim; the attention term is causal (QK^T and PV, half the square,
forward + backward = 3x forward). 790e12 is the H200's dense bf16 peak.

Prints one JSON line on stdout: pqrl_tok_s, baseline_tok_s, ratio, pqrl_mfu; details on stderr.
Needs only torch and transformers (imports pqrl.trajectory and trainer.* from this checkout).
Usage: python bench/gpu_trainer.py [--steps 5] [--warmup 3] [--no-compile] [--tiny]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pqrl.staleness import MIN_GROUP_EPISODES  # noqa: E402
from pqrl.trajectory import Trajectory  # noqa: E402
from trainer.advantages import grpo_advantages  # noqa: E402
from trainer.config import StepConfig  # noqa: E402
from trainer.objective import micro_batch_loss  # noqa: E402
from trainer.step import train_step  # noqa: E402

PEAK_FLOPS = 790e12
QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                 rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)  # fmt: skip
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True)  # fmt: skip


def say(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def build_model(shape: dict, device: torch.device) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**shape)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):  # initialise on the device: seconds instead of a minute on CPU
        model = Qwen2ForCausalLM(cfg)
    return model.to(device=device, dtype=torch.float32).eval()


def make_batches(n: int, args: argparse.Namespace, vocab: int) -> list[list[list[Trajectory]]]:
    """``n`` steps of Trajectory groups, lengths uniform in [min_len, max_len] up to ``tokens`` per step."""
    rng = np.random.default_rng(args.seed)
    behav = -math.log(vocab)  # about what a random-init model gives a random token
    batches = []
    for step in range(n):
        lengths: list[int] = []
        while sum(lengths) < args.tokens:
            lengths.append(int(rng.integers(args.min_len, args.max_len + 1)))
        trajs = []
        for i, length in enumerate(lengths):
            prompt = length // 2
            gen = (np.arange(length) >= prompt).astype(np.uint8)
            trajs.append(Trajectory(
                id=f"s{step}-{i}", run_id="bench", task_id=f"t{i // args.group_size}",
                group_id=f"s{step}-g{i // args.group_size}", env="bench",
                tokens=rng.integers(0, vocab, length), generated=gen, loss_mask=gen,
                behavior_logprobs=np.where(gen, behav, 0.0), versions=np.where(gen, 0, -1),
                prompt_len=prompt, reward=float(i % 2),
            ))  # fmt: skip
        groups = [trajs[i : i + args.group_size] for i in range(0, len(trajs), args.group_size)]
        if len(groups) > 1 and len(groups[-1]) < MIN_GROUP_EPISODES:  # the trainer would drop it
            groups[-2] += groups.pop()
        batches.append(groups)
    return batches


def baseline_step(
    model: Any, optimizer: Any, groups: list[list[Trajectory]], cfg: StepConfig, splits: int
) -> None:
    """The plain way: pad to the longest, full logits, log_softmax + gather, same loss, AdamW."""
    device = next(model.parameters()).device
    trajs = [t for g in groups for t in g]
    adv = torch.cat([grpo_advantages(torch.tensor([[t.reward for t in g]]))[0] for g in groups])
    T = max(t.num_tokens for t in trajs)

    def pad(name: str, dtype: torch.dtype) -> torch.Tensor:
        out = np.zeros((len(trajs), T), dtype=np.float64)
        for i, t in enumerate(trajs):
            out[i, : t.num_tokens] = getattr(t, name) if name else 1
        return torch.tensor(out, dtype=dtype, device=device)

    tokens, attention = pad("tokens", torch.long), pad("", torch.long)
    loss_mask, behav = pad("loss_mask", torch.float32)[:, 1:], pad("behavior_logprobs", torch.float32)[:, 1:]
    adv = adv.to(device)[:, None].expand_as(loss_mask)
    n_tokens = loss_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    for rows in torch.arange(len(trajs)).chunk(splits):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=tokens[rows], attention_mask=attention[rows], use_cache=False).logits
        z = logits[:, :-1].float()
        logp = torch.log_softmax(z / cfg.temperature if cfg.temperature != 1.0 else z, -1)
        logp = logp.gather(-1, tokens[rows, 1:, None])[..., 0]
        m = loss_mask[rows].bool()
        trained = logp[m]
        weights = torch.full_like(trained, 1.0 / float(n_tokens))
        out = micro_batch_loss(trained, trained.detach(), behav[rows][m], adv[rows][m], weights,
                               m.sum(-1).tolist(), cfg.algorithm)  # fmt: skip
        out.loss.backward()
        del logits, z, logp, trained, out
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()


def run_baseline(model: Any, batches: list, cfg: StepConfig, warmup: int, device: torch.device) -> float:
    """Baseline tokens/s on a copy of ``model``; the copy and its optimizer are freed on return."""
    base = copy.deepcopy(model)
    opt = torch.optim.AdamW(base.parameters(), lr=1e-6)
    try:
        return measure("baseline", lambda g: baseline_step(base, opt, g, cfg, 1), batches, warmup, device)
    except torch.cuda.OutOfMemoryError:
        say("baseline ran out of memory in one batch; retrying in two micro-batches")
    opt.zero_grad(set_to_none=True)
    _free(device)
    return measure(
        "baseline (2 micro-batches)", lambda g: baseline_step(base, opt, g, cfg, 2), batches, warmup, device
    )


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name: str, step_fn: Any, batches: list, warmup: int, device: torch.device) -> float:
    """Real tokens per second over the timed steps (after ``warmup`` untimed ones)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    tokens, elapsed = 0, 0.0
    for i, groups in enumerate(batches):
        _sync(device)
        start = time.perf_counter()
        step_fn(groups)
        _sync(device)
        dt = time.perf_counter() - start
        if i < warmup:
            say(f"  {name} warm-up step {i}: {dt:.2f} s")
            continue
        tokens += sum(t.num_tokens for g in groups for t in g)
        elapsed += dt
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    steps = len(batches) - warmup
    say(f"{name}: {tokens / elapsed:,.0f} tokens/s over {steps} steps, peak memory {peak:.1f} GiB")
    return tokens / elapsed


def flops_per_token(model: Any, batches: list) -> float:
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    lengths = np.array([t.num_tokens for groups in batches for g in groups for t in g], dtype=np.float64)
    mean_sq_over_mean = float((lengths**2).sum() / lengths.sum())
    return 6 * params + 6 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * mean_sq_over_mean


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5, help="timed steps per contender")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled pqrl variant")
    p.add_argument("--tiny", action="store_true", help="tiny model, short sequences, CPU: a smoke test")
    p.add_argument("--device", default=None, help="default: cuda when available (cpu with --tiny)")
    p.add_argument("--tokens", type=int, default=None, help="real tokens per step (16384; 1024 with --tiny)")
    p.add_argument("--micro-batch-tokens", type=int, default=16384, help="pqrl's packed row budget")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    shape = TINY if args.tiny else QWEN2_05B
    args.min_len, args.max_len = (16, 256) if args.tiny else (256, 4096)
    args.tokens = args.tokens or (1024 if args.tiny else 16384)
    args.group_size = 4
    default_device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    device = torch.device(args.device or default_device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny matmuls: more threads only spin-wait on a shared machine

    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    say(f"torch {torch.__version__}, transformers {transformers.__version__}, triton {triton_version}, "
        f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")  # fmt: skip

    start = time.perf_counter()
    model = build_model(shape, device)
    n_params = sum(q.numel() for q in model.parameters())
    say(f"model: {n_params / 1e6:.1f}M parameters, built in {time.perf_counter() - start:.1f} s")
    batches = make_batches(args.warmup + args.steps, args, shape["vocab_size"])
    per_step = [sum(t.num_tokens for g in b for t in g) for b in batches]
    n_seqs = [sum(len(g) for g in b) for b in batches]
    say(f"batches: {n_seqs} sequences, {per_step} real tokens per step")
    step_cfg = StepConfig(temperature=1.0, micro_batch_tokens=args.micro_batch_tokens, max_staleness=10**9)

    # baseline first, on a copy that is dropped: each contender gets the device's memory to itself
    baseline = run_baseline(model, batches, step_cfg, args.warmup, device)
    _free(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    variants = [("pqrl eager", False)] + (
        [("pqrl compiled", True)] if device.type == "cuda" and not args.no_compile else []
    )
    results = {}
    for name, compile in variants:
        cfg = dataclasses.replace(step_cfg, compile=compile)
        try:
            results[name] = measure(
                name, lambda g, c=cfg: train_step(model, opt, g, 0, c), batches, args.warmup, device
            )
        except Exception as e:  # noqa: BLE001 - a failed compiled variant must not lose the eager numbers
            if not compile:
                raise
            say(f"{name} failed, eager numbers stand: {type(e).__name__}: {e}")
    best = max(results, key=results.get)
    say(f"attention: {model.config._attn_implementation}; counted: {best}")
    pqrl = results[best]
    fpt = flops_per_token(model, batches[args.warmup :])
    say(f"FLOPs per token {fpt:.3e}; baseline MFU {baseline * fpt / PEAK_FLOPS:.3f}")
    print(json.dumps({
        "pqrl_tok_s": round(pqrl, 1),
        "baseline_tok_s": round(baseline, 1),
        "ratio": round(pqrl / baseline, 3),
        "pqrl_mfu": round(pqrl * fpt / PEAK_FLOPS, 4),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
