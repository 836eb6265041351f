"""Supervised fine-tuning on demonstration Trajectories: the cold start before RL.

The loss is the cross-entropy of the mask-1 tokens under temperature-1 log-probabilities (those
of ``trainer.logprobs.token_logprobs``, computed only where needed), token-mean over the whole step,
with the gradient norm clipped. Demonstrations are ordinary Trajectory records (recorded through
the agent loop by ``agent_loop.demonstrations``), so SFT trains on exactly the token layout RL
produces: prompts and observations are mask 0 and get no loss.

``pqrl sft CONFIG.yaml`` (``launcher.sft_command``) reads an ``SFTConfig`` plus the job config's
``model`` section, trains with a progress bar, logs every step to ``metrics.jsonl`` and saves the
model and tokenizer in Hugging Face format to ``output_dir`` (load it with
``pqrl.model_cache.load_model(output_dir)``, train from it with ``model.name: output_dir``).

Deliberately left out: packing several demonstrations into one row, evaluation during training,
checkpoints with optimizer state and resume, mixed precision, and FSDP; a cold start on a small
model is a few minutes on one device.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from pqrl.heap import bound_kernel_cache, trimming
from pqrl.trajectory import Trajectory
from trainer.layers import trim_before_optimizer_step, trims_before_layer_backward
from trainer.optim import adamw
from trainer.tied_embedding import rows_into_grad

__all__ = [
    "SFTConfig",
    "lr_factor",
    "masked_logprobs",
    "sft_step",
    "train_sft",
]


class SFTConfig(BaseModel):
    """One SFT run's settings, as written in its YAML file (with the job config's ``model`` section,
    ``launcher.sft_command.SFTJobConfig``); unknown keys are errors that name them."""

    model_config = ConfigDict(extra="forbid")

    demonstrations: str = Field(
        description="A file written by agent_loop.demonstrations.write_demonstrations, calc:N[:SEED] "
        "to record N calc demonstrations in place, or suite:FILE[:N] for the worked examples of a "
        "suite's first N tasks, rendered with the model section's template and tool parser."
    )
    output_dir: str = Field(description="Where the fine-tuned model, tokenizer and metrics.jsonl go.")
    epochs: int = Field(3, ge=1, description="Passes over the demonstrations.")
    batch_size: int = Field(16, ge=1, description="Demonstrations per optimizer step.")
    lr: float = Field(5e-5, gt=0, description="Peak AdamW learning rate.")
    warmup_steps: int = Field(5, ge=0, description="Steps of linear warm-up from 0 to lr.")
    schedule: Literal["constant", "cosine"] = Field(
        "cosine", description="After warm-up: keep lr, or decay it to 0 by the last step."
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Clip the gradient norm to this.")
    micro_batch_tokens: int = Field(
        4096, ge=1, description="Padded tokens (rows x longest) per forward pass; bounds memory."
    )
    max_steps: int | None = Field(None, ge=1, description="Stop after this many steps (default: all epochs).")
    device: str = Field("auto", description="cuda when available with auto, else e.g. cpu or cuda:1.")
    seed: int = Field(0, description="Seeds the shuffling of demonstrations and torch.")


def _packs(trajs: Sequence[Trajectory], budget: int) -> list[list[int]]:
    """Indices grouped so each micro-batch's padded size (rows x longest) stays within ``budget``."""
    order = sorted(range(len(trajs)), key=lambda i: trajs[i].num_tokens)  # similar lengths pad little
    packs: list[list[int]] = []
    for i in order:
        if packs and (len(packs[-1]) + 1) * trajs[i].num_tokens <= budget:
            packs[-1].append(i)
        else:
            packs.append([i])
    return packs


def _collate(trajs: Sequence[Trajectory], device: torch.device) -> tuple[torch.Tensor, ...]:
    T = max(t.num_tokens for t in trajs)
    tokens = np.zeros((len(trajs), T), np.int64)
    attention = np.zeros((len(trajs), T), np.int64)
    mask = np.zeros((len(trajs), T), np.float32)
    for i, t in enumerate(trajs):
        tokens[i, : t.num_tokens], attention[i, : t.num_tokens] = t.tokens, 1
        mask[i, : t.num_tokens] = t.loss_mask
    return tuple(torch.from_numpy(a).to(device) for a in (tokens, attention, mask))


def masked_logprobs(
    model: Any, tokens: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature-1 log-probabilities of the tokens where any row has loss mask 1, and their mask.

    Equal to ``trainer.logprobs.token_logprobs`` at those positions, but the vocabulary projection and
    log-softmax run only there (``logits_to_keep``): demonstrations train a fifth of their tokens.

    Returns:
        ``(logp, mask)``, both ``[B, K]`` for the K kept positions.
    """
    targets = torch.nonzero(loss_mask[:, 1:].any(dim=0))[:, 0] + 1  # position 0 has no prefix
    out = model(input_ids=tokens, attention_mask=attention_mask, logits_to_keep=targets - 1)
    logp = torch.log_softmax(out.logits.float(), dim=-1)
    return logp.gather(-1, tokens[:, targets, None])[..., 0], loss_mask[:, targets]


def sft_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    trajectories: Sequence[Trajectory],
    micro_batch_tokens: int = 4096,
    *,
    max_grad_norm: float = 1.0,
) -> dict[str, float]:
    """One optimizer step of token-mean cross-entropy on the mask-1 tokens of ``trajectories``.

    Returns metrics; when no token has loss mask 1 the loss is 0 and nothing is updated.
    """
    device = next(model.parameters()).device
    trajs = [t for t in trajectories if t.loss_mask.any()]  # the others add no loss and no gradient
    total = float(sum(int(t.loss_mask.sum()) for t in trajs))
    metrics = {"losses/sft_loss": 0.0, "losses/grad_norm": 0.0, "perf/tokens": total}
    if total == 0:
        return metrics
    optimizer.zero_grad(set_to_none=True)
    packs = _packs(trajs, micro_batch_tokens)
    for pack in packs:
        tokens, attention, mask = _collate([trajs[i] for i in pack], device)
        # the RL step's memory measures: a tied embedding's rows added in place, trims near the peak
        with rows_into_grad(model), trims_before_layer_backward(model, device):
            logp, weight = masked_logprobs(model, tokens, attention, mask)
            # NOTE: only mask-1 tokens (what the expert wrote) carry loss; prompt, observations and the
            # closing tokens nobody sampled are mask 0. Every micro-batch divides by the step's count.
            loss = -(logp * weight).sum() / total
            loss.backward()
        metrics["losses/sft_loss"] += float(loss.detach())
    metrics["losses/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    trim_before_optimizer_step(device)
    optimizer.step()
    metrics["perf/micro_batches"] = float(len(packs))
    return metrics


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Multiplier of the peak lr at optimizer step ``step`` (0-based): linear warm-up, then the schedule."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant" or total_steps <= warmup_steps:
        return 1.0
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def train_sft(
    cfg: SFTConfig,
    model: Any,
    trajectories: Sequence[Trajectory],
    *,
    log: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Fine-tunes ``model`` in place on ``trajectories`` as ``cfg`` says; returns each step's metrics."""
    from tqdm import tqdm

    demos = [t for t in trajectories if t.loss_mask.any()]
    if not demos:
        raise ValueError("no demonstration has a token with loss mask 1")
    rng = random.Random(cfg.seed)
    per_epoch = math.ceil(len(demos) / cfg.batch_size)
    total = per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, per_epoch * cfg.epochs)
    bound_kernel_cache()  # before the first matmul; a no-op once the process has built kernels
    optimizer = adamw(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    model.train()
    history: list[dict[str, Any]] = []
    bar = tqdm(total=total, desc="sft", unit="step", disable=not progress)
    step = 0
    while step < total:
        order = list(range(len(demos)))
        rng.shuffle(order)
        for start in range(0, len(order), cfg.batch_size):
            if step == total:
                break
            lr = cfg.lr * lr_factor(step, total, cfg.warmup_steps, cfg.schedule)
            for group in optimizer.param_groups:
                group["lr"] = lr
            t0 = time.perf_counter()
            batch = [demos[i] for i in order[start : start + cfg.batch_size]]
            with trimming():  # the step's freed activations fragment the heap (pqrl.heap)
                m = sft_step(model, optimizer, batch, cfg.micro_batch_tokens, max_grad_norm=cfg.max_grad_norm)
            row = {"step": step + 1, "epoch": step // per_epoch + 1, "lr": lr, **m}
            row["perf/step_s"] = time.perf_counter() - t0
            history.append(row)
            if log is not None:
                log(row)
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{m['losses/sft_loss']:.4f}")
    bar.close()
    model.eval()
    return history
