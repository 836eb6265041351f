"""One GRPO optimizer step on Trajectory groups: the compute core of the trainer loop (issue #7).

Input: groups of Trajectory records as read from the store. Output: the model updated once and
the step's metrics, namespaced as in CleanRL. What happens, in order:

1. staleness: trajectories whose oldest generated token is more than ``max_staleness`` versions
   behind the current one are dropped (counted, never silently);
2. advantages: GRPO per group over the valid members (``failed_infra`` and stale ones excluded),
   groups whose rewards are all equal carry no signal and are dropped (dynamic sampling);
3. proximal logprobs: recomputed under the current weights, before the update (one epoch here,
   so pi_prox is the current policy); the behaviour logprobs come from the engine;
4. loss: ``w * max(-A r, -A clip(r))`` with ``r = pi_theta / pi_prox`` and the single capped,
   detached weight ``w = min(pi_prox / pi_behavior, C)`` (DESIGN.md section 5), token-mean over
   mask-1 tokens of the whole step, accumulated over micro-batches packed by a token budget;
5. clip the gradient norm, step the optimizer.

Deliberately left out here (the loop's job, next): reading from Redis, K epochs and minibatches,
warm-up schedules, bf16 autocast, gradient checkpointing, FSDP2, KL to a reference model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pqrl.trajectory import Status, Trajectory
from trainer.advantages import grpo_advantages
from trainer.losses import aggregate_loss, decoupled_ppo_loss, masked_mean

__all__ = ["StepConfig", "token_logprobs", "train_step"]


@dataclass(frozen=True)
class StepConfig:
    eps_low: float = 0.2
    eps_high: float = 0.28  # DAPO clip-higher
    is_cap: float = 2.0
    temperature: float = 1.0  # the sampling temperature: logprobs are log_softmax(logits / T)
    max_staleness: int = 1
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 8192


def token_logprobs(model: Any, tokens: Tensor, attention_mask: Tensor, temperature: float) -> Tensor:
    """``[B, T]`` log-probability of each token given its prefix (position 0 gets 0)."""
    logits = model(input_ids=tokens, attention_mask=attention_mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(logp, (1, 0))


def _collate(trajs: Sequence[Trajectory], device: torch.device) -> dict[str, Tensor]:
    T = max(t.num_tokens for t in trajs)

    def pad(name: str, dtype: torch.dtype, fill: float = 0) -> Tensor:
        out = np.full((len(trajs), T), fill, dtype=np.float64)
        for i, t in enumerate(trajs):
            out[i, : t.num_tokens] = getattr(t, name)
        return torch.tensor(out, dtype=dtype, device=device)

    return {
        "tokens": pad("tokens", torch.long),
        "attention_mask": torch.tensor(
            [[1] * t.num_tokens + [0] * (T - t.num_tokens) for t in trajs], dtype=torch.long, device=device
        ),
        "loss_mask": pad("loss_mask", torch.float32),
        "behavior_logprobs": pad("behavior_logprobs", torch.float32),
        "versions": pad("versions", torch.long, -1),
    }


def _micro_batches(trajs: list[Trajectory], budget: int) -> list[list[int]]:
    """Indices packed so each micro-batch's padded size (rows x longest) stays within ``budget``."""
    order = sorted(range(len(trajs)), key=lambda i: trajs[i].num_tokens)  # similar lengths pad little
    batches: list[list[int]] = [[]]
    for i in order:
        rows = batches[-1] + [i]
        if batches[-1] and len(rows) * trajs[i].num_tokens > budget:
            batches.append([i])
        else:
            batches[-1] = rows
    return [b for b in batches if b]


def train_step(
    model: Any, optimizer: torch.optim.Optimizer, groups: Sequence[Sequence[Trajectory]], version: int,
    cfg: StepConfig | None = None,
) -> dict[str, float]:  # fmt: skip
    """One optimizer step on ``groups``; returns metrics (nothing is updated when no group is usable)."""
    cfg = cfg or StepConfig()
    device = next(model.parameters()).device
    counts: Counter[str] = Counter()
    staleness: Counter[int] = Counter()
    used: list[Trajectory] = []
    advantages: list[float] = []
    for group in groups:
        valid = []
        for t in group:
            if t.status is Status.FAILED_INFRA or t.num_generated == 0:
                counts["dropped/failed_infra"] += 1
                continue
            age = version - int(t.versions[t.generated.astype(bool)].min())
            staleness[age] += 1
            if age > cfg.max_staleness:
                counts["dropped/stale"] += 1
                continue
            valid.append(t)
        rewards = torch.tensor([[t.reward for t in valid]], dtype=torch.float32)
        if len(valid) < 2:
            counts["dropped/groups_too_few_valid"] += 1
            continue
        if bool((rewards == rewards[0, 0]).all()):  # every advantage would be 0 (DAPO dynamic sampling)
            counts["dropped/no_signal_groups"] += 1
            continue
        used += valid
        advantages += grpo_advantages(rewards)[0].tolist()
    metrics: dict[str, float] = {k: float(v) for k, v in counts.items()}
    metrics |= {f"offpolicy/staleness_{k}": float(v) for k, v in sorted(staleness.items())}
    metrics["rollout/trajectories_used"] = float(len(used))
    if not used:
        return metrics

    batches = _micro_batches(used, cfg.micro_batch_tokens)
    total_tokens = float(sum(int(t.loss_mask.sum()) for t in used))
    model.eval()  # no dropout: proximal and trained logprobs come from the same function
    with torch.no_grad():
        prox = [
            token_logprobs(model, mb["tokens"], mb["attention_mask"], cfg.temperature)
            for mb in (_collate([used[i] for i in b], device) for b in batches)
        ]
    optimizer.zero_grad(set_to_none=True)
    sums: Counter[str] = Counter()
    for b, logp_prox in zip(batches, prox, strict=True):
        mb = _collate([used[i] for i in b], device)
        mask = mb["loss_mask"]
        adv = torch.tensor([advantages[i] for i in b], device=device)[:, None].expand_as(mask)
        logp = token_logprobs(model, mb["tokens"], mb["attention_mask"], cfg.temperature)
        out = decoupled_ppo_loss(logp, logp_prox, mb["behavior_logprobs"], adv, mask,
                                 eps_low=cfg.eps_low, eps_high=cfg.eps_high, is_cap=cfg.is_cap)  # fmt: skip
        # token-mean over the whole step: every micro-batch divides by the step's token count
        loss = aggregate_loss(out.loss, mask, "token-mean", normalizer=total_tokens)
        loss.backward()
        n = float(mask.sum())
        sums["losses/pg_loss"] += float(loss.detach()) * total_tokens
        sums["losses/clipfrac"] += float(masked_mean(out.clipped.float(), mask)) * n
        sums["offpolicy/tis_weight_mean"] += float(masked_mean(out.is_weight, mask)) * n
        sums["offpolicy/tis_weight_max"] = max(
            sums["offpolicy/tis_weight_max"], float((out.is_weight * mask).max())
        )
        # engine vs trainer on tokens of the current version (k1 estimate of KL(behaviour || prox))
        current = mask * (mb["versions"] == version)
        sums["offpolicy/mismatch_kl"] += float(((mb["behavior_logprobs"] - logp_prox) * current).sum())
        sums["_current_tokens"] += float(current.sum())
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    metrics |= {
        "losses/pg_loss": sums["losses/pg_loss"] / total_tokens,
        "losses/clipfrac": sums["losses/clipfrac"] / total_tokens,
        "offpolicy/tis_weight_mean": sums["offpolicy/tis_weight_mean"] / total_tokens,
        "offpolicy/tis_weight_max": sums["offpolicy/tis_weight_max"],
        "offpolicy/mismatch_kl": sums["offpolicy/mismatch_kl"] / max(sums["_current_tokens"], 1.0),
        "losses/grad_norm": float(grad_norm),
        "perf/tokens": total_tokens,
        "perf/micro_batches": float(len(batches)),
    }
    return metrics
