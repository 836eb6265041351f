"""The loss the training step backpropagates, assembled from ``trainer.losses``: pure math over the
trained tokens of one micro-batch, concatenated sequence after sequence (every tensor ``[n]``).

For token ``t`` of sequence ``i``, with ``r = pi_theta / pi_prox``::

    loss = sum_t w_i * v_t * max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))
           - entropy_coef * sum_t w_i H_t
           + kl_coef * sum_t w_i KL_t(pi_theta || pi_ref)     (unless the KL is in the reward)
           + vf_coef * sum_t w_i L^V_t                          (with a critic)

- ``w_i``: the sequence's factor in its minibatch's average (``aggregation``), so that the
  micro-batches' losses add up to the aggregate ``loss_agg`` asks for;
- ``v_t``: the single detached off-policy weight ``min(pi_prox / pi_behavior, C)`` (capped or
  masked), per token or one per sequence (``offpolicy_weights``); it covers both engine/trainer
  mismatch and staleness (decoupled PPO);
- the clip is clip-higher, with an optional dual clip; ``L^V`` is PPO's clipped value loss.

``micro_batch_loss`` returns the loss and the sums the step records. ``offpolicy_sums`` gives the
sums that split the off-policy weight into engine mismatch and staleness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from trainer.config import AlgorithmConfig
from trainer.losses import (
    clipped_surrogate,
    clipped_value_loss,
    kl_estimate,
    sequence_weights,
    truncated_is_weights,
)

__all__ = ["MicroBatchLoss", "aggregation", "micro_batch_loss", "offpolicy_sums", "offpolicy_weights"]


class MicroBatchLoss(NamedTuple):
    """``loss``: the scalar to backpropagate. ``sums``: what the step adds up over micro-batches
    (undetached; ``pg_loss``, ``entropy_bonus`` and ``value_loss`` carry the factors ``w_i``)."""

    loss: Tensor
    sums: dict[str, Tensor]


def aggregation(lengths: Sequence[int], alg: AlgorithmConfig) -> tuple[list[float], float]:
    """Each sequence's factor ``w_i`` in its minibatch's loss (``trainer.losses.sequence_weights``),
    for sequences of ``lengths`` trained tokens, and the aggregation's denominator (tokens for
    token_mean, sequences, or sequences x the constant)."""
    weights = sequence_weights(list(lengths), alg.loss_agg, alg.agg_tokens)
    seqs = float(sum(1 for n in lengths if n > 0))
    normalizer = {"token_mean": float(sum(lengths)), "seq_mean_token_sum_norm": seqs * (alg.agg_tokens or 1)}
    return weights, normalizer.get(alg.loss_agg, seqs)


def offpolicy_weights(
    logp_prox: Tensor, logp_behavior: Tensor, lengths: Sequence[int], alg: AlgorithmConfig
) -> Tensor:
    """The off-policy weight of each token: per token, or one per sequence of ``lengths`` tokens
    (its tokens' ratios multiplied), capped or masked as ``alg`` says; all 1 when it is off."""
    if alg.is_mode == "off":  # the ablation's baseline: samples treated as the trainer's own
        return torch.ones_like(logp_prox)
    if alg.is_level == "token":
        return truncated_is_weights(
            logp_prox, logp_behavior, torch.ones_like(logp_prox), cap=alg.is_cap, mode=alg.is_mode
        )
    per_sequence = [
        truncated_is_weights(
            p[None], b[None], torch.ones_like(p[None]), level="sequence", cap=alg.is_cap, mode=alg.is_mode
        )[0]
        for p, b in zip(logp_prox.split(list(lengths)), logp_behavior.split(list(lengths)), strict=True)
    ]
    return torch.cat(per_sequence)


def micro_batch_loss(
    logp: Tensor,
    logp_prox: Tensor,
    logp_behavior: Tensor,
    advantages: Tensor,
    weights: Tensor,
    lengths: Sequence[int],
    alg: AlgorithmConfig,
    *,
    entropy: Tensor | None = None,
    logp_ref: Tensor | None = None,
    values: Tensor | None = None,
    values_old: Tensor | None = None,
    returns: Tensor | None = None,
) -> MicroBatchLoss:
    """One micro-batch's share of its minibatch's loss (see the module docstring).

    Args:
        logp: log-probs of the trained tokens under the policy being trained (the gradient path).
        logp_prox: under the proximal policy (detached here).
        logp_behavior: the engine's, from the rollout.
        advantages: per token.
        weights: per token, its sequence's factor ``w_i`` (``aggregation``).
        lengths: trained tokens per sequence, in order (they sum to ``n``).
        alg: the clip, off-policy weight, coefficients and KL estimator.
        entropy: per token; needed when ``alg.entropy_coef`` is on.
        logp_ref: under the reference policy; None: no reference model. A KL charged to the reward
            (``alg.kl_in_reward``) adds no loss term.
        values: the critic's ``V(s_t)`` (gradient path); with ``values_old`` (before the first
            update) and ``returns``: PPO's value loss. None: no critic.
    """
    surrogate = clipped_surrogate(
        logp, logp_prox, advantages, eps_low=alg.eps_low, eps_high=alg.eps_high, dual_clip_c=alg.dual_clip_c
    )
    is_w = offpolicy_weights(logp_prox, logp_behavior, lengths, alg)
    pg = (weights * is_w * surrogate.loss).sum()
    loss = pg
    sums = {
        "pg_loss": pg,
        "clipped": surrogate.clipped.sum(),
        "dual_clipped": surrogate.dual_clipped.sum(),
        "is_weight": is_w.sum(),
        "is_masked": (is_w == 0).sum(),
        "trained": logp.new_tensor(len(logp)),
    }
    if alg.entropy_coef:
        if entropy is None:
            raise ValueError("algorithm.entropy_coef > 0 needs the entropy")
        bonus = (weights * entropy).sum()
        loss = loss - alg.entropy_coef * bonus
        sums["entropy_bonus"] = bonus
    if logp_ref is not None and not alg.kl_in_reward:
        kl = kl_estimate(logp, logp_ref, alg.kl_estimator)
        loss = loss + alg.kl_coef * (weights * kl).sum()
        sums["kl_ref"] = kl.sum()
    if values is not None:
        if values_old is None or returns is None:
            raise ValueError("the value loss needs values_old and returns")
        per_token, clipped = clipped_value_loss(values, values_old, returns.to(values), alg.vf_clip)
        value_loss = (weights * per_token).sum()
        loss = loss + alg.vf_coef * value_loss
        sums |= {"value_loss": value_loss, "vf_clipped": clipped.sum(), "value": values.detach().sum()}
    return MicroBatchLoss(loss, sums)


def offpolicy_sums(
    logp_prox: Tensor, logp_behavior: Tensor, versions: Tensor, version: int, cap: float
) -> dict[str, Tensor]:
    """Sums over tokens of the token-level capped weight, split by engine mismatch (tokens of the
    current ``version``) and staleness (older ``versions``)."""
    w = truncated_is_weights(logp_prox, logp_behavior, torch.ones_like(logp_prox), cap=cap)
    current = (versions == version).float()
    stale = 1.0 - current
    k1 = logp_behavior - logp_prox  # k1 estimate of KL(behaviour || prox)
    return {
        "tis_weight": w.sum(),
        "tis_weight_max": w.max(),
        "tis_weight_clipped": ((logp_prox - logp_behavior) > math.log(cap)).sum() if cap else w.new_zeros(()),
        "current_tokens": current.sum(),
        "mismatch_kl": (k1 * current).sum(),
        "mismatch_tis_weight": (w * current).sum(),
        "stale_tokens": stale.sum(),
        "stale_kl": (k1 * stale).sum(),
        "stale_tis_weight": (w * stale).sum(),
        "staleness": (version - versions).float().sum(),
    }
