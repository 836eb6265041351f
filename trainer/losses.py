"""The terms of the policy loss, each a pure function of torch tensors; ``trainer.objective``
puts them together into the loss the training step backpropagates.

- ``clipped_surrogate``: PPO's clipped objective with asymmetric clip (DAPO clip-higher) and an
  optional dual clip for negative advantages.
- ``truncated_is_weights``: the one capped importance weight ``w = min(pi_prox / pi_behavior, C)``;
  TIS when the sample is on-policy (engine/trainer mismatch), decoupled PPO when it is stale.
- ``kl_estimate``, ``entropy_from_logits``, ``clipped_value_loss``.
- ``sequence_weights``: each sequence's factor in a loss averaged as ``loss_agg`` says, so that
  micro-batches summed one by one give the minibatch's average.

Shapes are ``[B, T]`` (sequences x tokens) or any shape alike unless stated. Only ``logp`` (the
policy being trained) and a critic's values carry gradient; old/proximal/behaviour/reference
log-probs, returns and all importance weights are detached here, whatever the caller passes.

Deliberately left out: coefficient schedules and metric names (the trainer's). Advantage
estimators live in ``trainer.advantages``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

__all__ = [
    "AggregationMode",
    "PolicyLossOutput",
    "clipped_surrogate",
    "clipped_value_loss",
    "entropy_from_logits",
    "kl_estimate",
    "sequence_weights",
    "truncated_is_weights",
]

AggregationMode = Literal[
    "token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"
]

# exp(20) ~ 4.9e8: beyond this a ratio is meaningless, and exp() would overflow to inf, turning
# 0 * inf into NaN on tokens with zero advantage or under the mask.
_LOG_RATIO_CLAMP = 20.0


class PolicyLossOutput(NamedTuple):
    """Per-token policy loss and what the trainer logs about it (all ``[B, T]``).

    Attributes:
        loss: per-token loss, differentiable w.r.t. ``logp``.
        ratio: detached ``exp(logp - logp_old)`` (``pi_theta / pi_prox`` for decoupled PPO).
        clipped: bool, the PPO clip is active (the clipped term wins, its gradient is 0).
        dual_clipped: bool, the dual-clip cap ``-c * A`` is active (only where A < 0).
    """

    loss: Tensor
    ratio: Tensor
    clipped: Tensor
    dual_clipped: Tensor


def clipped_surrogate(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: float | None = None,
) -> PolicyLossOutput:
    """PPO clipped surrogate per token (Schulman et al., 2017), as a loss to minimise.

    ``ratio = exp(logp - logp_old)``,
    ``loss = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high))``; with a dual clip
    ``c`` (Ye et al., 2020) the loss of tokens with ``A < 0`` is further capped at ``-c * A``,
    so a huge ratio on a bad token cannot blow up the update. DAPO's clip-higher is
    ``eps_low=0.2, eps_high=0.28``; a typical dual clip is ``c=3.0``.

    Args:
        logp: ``[B, T]`` log-probs of the sampled tokens under the policy being trained.
        logp_old: ``[B, T]`` log-probs under the policy the ratio is taken against (detached).
        advantages: ``[B, T]`` per-token advantages (see ``broadcast_to_tokens``); detached.
        eps_low: lower clip range, ratio floor ``1 - eps_low``.
        eps_high: upper clip range, ratio ceiling ``1 + eps_high``.
        dual_clip_c: dual-clip constant (> 1), or None for no dual clip.

    Returns:
        ``PolicyLossOutput``.
    """
    if advantages.dim() != logp.dim():
        raise ValueError("advantages must be per token, shaped like logp; see broadcast_to_tokens")
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
    adv = advantages.detach()
    logratio = (logp - logp_old.detach()).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(logratio)
    pg_loss1 = -adv * ratio
    pg_loss2 = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg_loss = torch.maximum(pg_loss1, pg_loss2)
    clipped = pg_loss2 > pg_loss1
    if dual_clip_c is None:
        dual_clipped = torch.zeros_like(clipped)
    else:
        pg_loss3 = -adv * dual_clip_c
        dual_clipped = (adv < 0) & (pg_loss3 < pg_loss)
        pg_loss = torch.where(dual_clipped, pg_loss3, pg_loss)
    return PolicyLossOutput(
        loss=pg_loss,
        ratio=ratio.detach(),
        clipped=clipped,
        dual_clipped=dual_clipped,
    )


@torch.no_grad()
def truncated_is_weights(
    logp_prox: Tensor,
    logp_behavior: Tensor,
    mask: Tensor,
    *,
    level: Literal["token", "sequence"] = "token",
    cap: float | None = 2.0,
    mode: Literal["truncate", "mask"] = "truncate",
) -> Tensor:
    """The single behaviour-correction weight ``w = min(pi_prox / pi_behavior, C)``, detached.

    On-policy samples (prox = current trainer recompute) make this TIS against the engine's
    numerics (Yao et al., 2025); stale samples make it the behaviour term of decoupled PPO
    (Hilton et al., 2021; AReaL). The caller logs the two cases separately by token version.

    Args:
        logp_prox: ``[B, T]`` proximal-policy log-probs (recomputed by the trainer).
        logp_behavior: ``[B, T]`` log-probs the engine reported when sampling.
        mask: ``[B, T]`` 0/1; tokens that count. At ``level="sequence"`` the log-ratios of the
            masked-in tokens are summed (pass the ``generated`` mask for a whole-sequence weight).
        level: ``"token"``: one weight per token. ``"sequence"``: ``exp(sum_t log-ratio)``, one
            weight per sequence, broadcast to its tokens.
        cap: ``C``; None disables the cap (weights still stop at ``exp(20)``, see above).
        mode: ``"truncate"`` clips weights above ``C`` to ``C`` (TIS); ``"mask"`` sets them to 0
            (masked IS: the token or sequence is dropped instead of down-weighted).

    Returns:
        ``[B, T]`` weights, 0 where ``mask`` is 0.
    """
    m = mask.bool()
    log_w = torch.where(m, logp_prox - logp_behavior, 0.0)
    if level == "sequence":
        log_w = log_w.sum(dim=-1, keepdim=True).expand_as(log_w)
    elif level != "token":
        raise ValueError(f"unknown level {level!r}")
    if mode not in ("truncate", "mask"):
        raise ValueError(f"unknown mode {mode!r}")
    w = torch.exp(log_w.clamp(max=_LOG_RATIO_CLAMP))
    if cap is not None:
        w = w.clamp(max=cap) if mode == "truncate" else torch.where(w > cap, 0.0, w)
    return torch.where(m, w, 0.0)


def kl_estimate(logp: Tensor, logp_ref: Tensor, kind: Literal["k1", "k2", "k3"] = "k3") -> Tensor:
    """Per-token estimators of ``KL(pi_theta || pi_ref)`` from sampled tokens (Schulman, 2020).

    ``k1 = logp - logp_ref`` (unbiased, high variance, can be negative);
    ``k2 = 0.5 * (logp - logp_ref)^2`` (biased, low variance);
    ``k3 = exp(ref - logp) - (ref - logp) - 1`` (unbiased, low variance, always >= 0).

    Args:
        logp: ``[B, T]`` log-probs under the policy being trained (carries gradient).
        logp_ref: ``[B, T]`` log-probs under the reference policy (detached).
        kind: which estimator.

    Returns:
        ``[B, T]`` per-token KL estimates.
    """
    logratio = logp - logp_ref.detach()
    if kind == "k1":
        return logratio
    if kind == "k2":
        return 0.5 * logratio.square()
    if kind == "k3":
        ref_minus_logp = (-logratio).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        return torch.exp(ref_minus_logp) - ref_minus_logp - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}")


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy ``-sum_v p_v log p_v`` of the softmax over the last dim, computed stably.

    Divide the logits by the sampling temperature first so the entropy is that of the sampling
    distribution. ``-inf`` logits (banned tokens) contribute 0 and give finite gradients.

    Args:
        logits: ``[..., V]``; half precision is upcast to float32.

    Returns:
        ``[...]`` entropies in nats.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    # p * logp is 0 * -inf = NaN for banned tokens; zero logp there (p is 0 anyway) so that
    # neither the value nor the gradient sees the NaN.
    logp_finite = torch.where(torch.isfinite(logp), logp, 0.0)
    return -(logp.exp() * logp_finite).sum(dim=-1)


def sequence_weights(lengths: list[int], mode: AggregationMode, max_len: int | None = None) -> list[float]:
    """Per-sequence factors ``w_i`` such that ``sum_i w_i * sum_t loss_it`` is the ``mode`` average
    of per-token losses over sequences of ``lengths`` trained tokens: a loss summed micro-batch by
    micro-batch then gets the average of the whole minibatch. With ``n_i`` tokens in sequence ``i``
    and ``S`` sequences that have any:

    - ``"token_mean"`` (DAPO): every token weighs the same, ``1 / sum_j n_j``; long responses are
      not down-weighted.
    - ``"seq_mean_token_sum"``: each sequence's token sum, then the mean over sequences, ``1 / S``.
    - ``"seq_mean_token_mean"`` (GRPO paper): each sequence's token mean, then the mean over
      sequences, ``1 / (S n_i)``.
    - ``"seq_mean_token_sum_norm"`` (Dr.GRPO): each sequence's token sum over the constant
      ``max_len``, then the mean over sequences, ``1 / (S max_len)``: no length bias.

    Sequences without tokens (a dropped turn) neither add loss nor dilute the mean.
    """
    seqs = sum(1 for n in lengths if n > 0) or 1
    if mode == "token_mean":
        return [1.0 / max(sum(lengths), 1)] * len(lengths)
    if mode == "seq_mean_token_sum":
        return [1.0 / seqs] * len(lengths)
    if mode == "seq_mean_token_mean":
        return [1.0 / (seqs * n) if n > 0 else 0.0 for n in lengths]
    if mode == "seq_mean_token_sum_norm":
        if max_len is None:
            raise ValueError("seq_mean_token_sum_norm needs max_len")
        return [1.0 / (seqs * max_len)] * len(lengths)
    raise ValueError(f"unknown aggregation mode {mode!r}")


def clipped_value_loss(
    values: Tensor, values_old: Tensor, returns: Tensor, clip: float | None = 0.2
) -> tuple[Tensor, Tensor]:
    """PPO's value loss per token, ``0.5 * max((V - R)^2, (V_clip - R)^2)`` with
    ``V_clip = V_old + clip(V - V_old, -clip, clip)``: the critic moves at most ``clip`` from the
    values the advantages were computed with, unless that brings it closer to the return.

    Returns:
        ``(loss, clipped)``: the per-token loss (differentiable w.r.t. ``values``) and where the
        clipped term won.
    """
    values_old, returns = values_old.detach(), returns.detach()
    unclipped = (values - returns).square()
    if clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    v_clip = values_old + (values - values_old).clamp(-clip, clip)
    clipped_sq = (v_clip - returns).square()
    return 0.5 * torch.maximum(unclipped, clipped_sq), clipped_sq > unclipped
