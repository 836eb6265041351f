"""One policy-gradient training step on Trajectory groups: the compute core of the trainer loop.

Input: groups of Trajectory records as read from the store. Output: the model updated
``ppo_epochs x minibatches`` times and the step's metrics, namespaced as in CleanRL. What is
optimised is ``cfg.algorithm`` (``trainer.config.AlgorithmConfig``). In order:

1. screening (``trainer.screening``): trajectories whose oldest generated token is more than
   ``max_staleness`` versions behind the current one are dropped (counted, never silently), and,
   with ``filter_truncated``, those that ended at a token limit; groups left with fewer than two
   members, or whose (shaped) rewards are all equal, are dropped (dynamic sampling), except under a
   batch-mean baseline;
2. rewards: the verifier's, plus the overlong penalty (``overlong_buffer``), minus
   ``kl_coef * sum_t KL_t`` with ``kl_in_reward``; advantages by ``algorithm.advantage`` (GRPO
   with or without the std, Dr.GRPO, RLOO, batch-mean REINFORCE), one per sequence, or PPO's:
   per-token GAE from a critic's values (``trainer.critic``) over the agent's own tokens;
3. proximal logprobs (``trainer.batch``): recomputed under the current weights once, before the
   first update. With one epoch and one minibatch there is a single update, so pi_prox is exactly
   the policy of the training forward and its detached logprobs are used (no second forward pass);
   the behaviour logprobs come from the engine; reference logprobs (optional) from ``ref_model``;
4. loss (``trainer.objective.micro_batch_loss``): ``w * max(-A r, -A clip(r))`` with
   ``r = pi_theta / pi_prox`` (clip-higher, optional dual clip) and the single capped or masked,
   detached weight ``w = pi_prox / pi_behavior`` per token or per sequence (one weight covers both
   engine/trainer mismatch and staleness), minus ``entropy_coef * H``, plus
   ``kl_coef * KL(pi_theta || pi_ref)`` unless the KL is in the reward, plus ``vf_coef`` times the
   clipped value loss with a critic; per-token terms are averaged by ``loss_agg`` over the
   minibatch (each sequence's tokens carry the factor ``trainer.objective.aggregation`` gives it),
   gradients accumulated over micro-batches of at most ``micro_batch_tokens`` tokens;
5. per minibatch: clip the gradient norm, step the optimizer, then the scheduler.

Under FSDP2 (``ctx``, see ``trainer.distributed``) every rank passes the same groups; each trains
its share of the trajectories (balanced by tokens), divides by the global token count of the
minibatch, runs as many passes as the busiest rank (empty ones on a dummy row) and the step's
metric sums are added over ranks.

Deliberately left out here (the loop's job): reading from Redis, warm-up schedules (pass a
``scheduler``). A critic under FSDP2 (PPO trains in one process).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pqrl.shaping import kl_penalized
from pqrl.trajectory import Trajectory
from trainer.advantages import agent_token_gae, estimate_advantages
from trainer.batch import (
    Batch,
    add_sums,
    autocast,
    check_abort,
    checkpointing,
    empty_pass,
    forward_logprobs,
    full_tensor,
    proximal_logprobs,
    record_offpolicy,
    reference_logprobs,
)
from trainer.config import StepConfig
from trainer.distributed import DistContext, all_reduce_sums, equalize_passes, shard_of
from trainer.layers import trim_before_optimizer_step, trims_before_layer_backward
from trainer.losses import kl_estimate
from trainer.objective import micro_batch_loss
from trainer.packing import enable_packed_attention
from trainer.rollout_log import note_advantages
from trainer.screening import select_trajectories
from trainer.tied_embedding import rows_into_grad

__all__ = ["micro_batch_backward", "step_metrics", "train_step"]

# the step's metric sums, added over ranks
_SUMS = (
    "pg_loss", "clipped", "dual_clipped", "trained", "entropy", "entropy_bonus", "is_weight", "is_masked",
    "value_loss", "vf_clipped", "value",
    "tis_weight", "tis_weight_max", "tis_weight_clipped", "current_tokens", "mismatch_kl",
    "mismatch_tis_weight", "stale_tokens", "stale_kl", "stale_tis_weight", "staleness", "kl_ref",
)  # fmt: skip


def micro_batch_backward(
    model: Any, batch: Batch, members: list[int], mode: str | None, weight: dict[int, float],
    sums: dict[str, Tensor], *, version: int, prox: dict[int, Tensor] | None,
    ref: dict[int, Tensor] | None,
) -> None:  # fmt: skip
    """Backpropagates one micro-batch's share of the minibatch loss (``trainer.objective``, each
    member's token losses times its aggregation ``weight``) and adds its sums. ``prox`` None: on
    policy, pi_prox is the training forward's own (detached) policy; ``ref`` None: no KL loss term."""
    cfg, alg = batch.cfg, batch.cfg.algorithm
    with (
        checkpointing(model, cfg.gradient_checkpointing),
        rows_into_grad(model),
        trims_before_layer_backward(model, batch.device),
    ):
        with autocast(batch.device, cfg, cache=False):
            logp, entropy, values = forward_logprobs(
                model, batch, members, mode, with_entropy=prox is None or alg.entropy_coef > 0,
                critic=batch.critic,
            )  # fmt: skip
        if prox is None:
            logp_prox = logp.detach()
            record_offpolicy(sums, batch, members, logp_prox, entropy, version)
        else:
            logp_prox = _cat(prox, members)
        out = micro_batch_loss(
            logp,
            logp_prox,
            batch.per_token(members, "behavior_logprobs", torch.float32),
            batch.per_token(members, "advantages", torch.float32),
            batch.spread(members, weight, torch.float32),
            batch.lengths(members),
            alg,
            entropy=entropy,
            logp_ref=None if ref is None else _cat(ref, members),
            values=values,
            values_old=None if values is None else _cat(batch.values_old, members),
            returns=None if values is None else _cat(batch.returns, members),
        )
        out.loss.backward()
    add_sums(sums, out.sums)


def _cat(per_member: dict[int, Tensor], members: list[int]) -> Tensor:
    """The per-token tensors of ``members``, end to end."""
    return torch.cat([per_member[i] for i in members])


def _minibatch_update(
    model: Any, optimizer: torch.optim.Optimizer, scheduler: Any, batch: Batch, minibatch: np.ndarray,
    own: set[int], ctx: DistContext, mode: str | None, sums: dict[str, Tensor], *, version: int,
    prox: dict[int, Tensor] | None, ref: dict[int, Tensor] | None,
) -> tuple[Tensor, float]:  # fmt: skip
    """One optimizer (and scheduler) step on this rank's share of ``minibatch``; returns the gradient
    norm before clipping and the aggregation's denominator."""
    cfg = batch.cfg
    # every rank weighs its members within the whole minibatch: the reduced gradient is the aggregate's
    weight, normalizer = batch.aggregation(minibatch.tolist())
    optimizer.zero_grad(set_to_none=True)
    passes = batch.micro_batches(sorted(i for i in minibatch.tolist() if i in own))
    for members in equalize_passes(passes, ctx):
        if not members:
            with checkpointing(model, cfg.gradient_checkpointing), autocast(batch.device, cfg, cache=False):
                empty_pass(model, batch.device).backward()
            continue
        micro_batch_backward(model, batch, members, mode, weight, sums, version=version, prox=prox, ref=ref)
    check_abort(batch)  # the last chance before the weights change
    params = list(model.parameters()) + ([] if batch.critic is None else list(batch.critic.parameters()))
    grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
    trim_before_optimizer_step(batch.device)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # applied: freed now, not held while the trainer waits
    if scheduler is not None:
        scheduler.step()
    return grad_norm, normalizer


def step_metrics(
    sums: dict[str, Tensor], ctx: DistContext, n_tokens: list[int], micro_batches: int,
    grad_norms: list[Tensor], normalizers: list[float], cfg: StepConfig, with_ref: bool,
) -> dict[str, float]:  # fmt: skip
    """The step's loss, policy, off-policy and perf metrics from its sums, added over ranks."""
    alg = cfg.algorithm
    s = all_reduce_sums({k: float(v) for k, v in sums.items()}, _SUMS, ctx)  # every key, 0 if missing
    s["trained"] = max(s["trained"], 1.0)
    total = float(max(sum(n_tokens), 1))
    updates = max(len(grad_norms), 1)
    metrics = {
        # the aggregated policy loss of an optimizer step, averaged over the step's updates
        "losses/pg_loss": s["pg_loss"] / updates,
        "losses/clipfrac": s["clipped"] / s["trained"],
        "losses/grad_norm": float(torch.stack([g.float() for g in grad_norms]).mean()),
        "losses/agg_normalizer": sum(normalizers) / updates,
        "policy/entropy": s["entropy"] / total,
        "offpolicy/is_weight_mean": s["is_weight"] / s["trained"],
        "offpolicy/tis_weight_mean": s["tis_weight"] / total,
        "offpolicy/tis_weight_max": s["tis_weight_max"],
        "offpolicy/tis_weight_clipped_frac": s["tis_weight_clipped"] / total,
        # engine vs trainer on tokens of the current version (k1 estimate of KL(behaviour || prox))
        "offpolicy/mismatch_kl": s["mismatch_kl"] / max(s["current_tokens"], 1.0),
        "offpolicy/mismatch_tis_weight_mean": s["mismatch_tis_weight"] / max(s["current_tokens"], 1.0),
        # tokens of older versions: the weight is the decoupled-PPO behaviour correction
        "offpolicy/stale_kl": s["stale_kl"] / max(s["stale_tokens"], 1.0),
        "offpolicy/stale_tis_weight_mean": s["stale_tis_weight"] / max(s["stale_tokens"], 1.0),
        "offpolicy/stale_token_frac": s["stale_tokens"] / total,
        "offpolicy/staleness_mean": s["staleness"] / total,
        "perf/tokens": float(sum(n_tokens)),
        "perf/micro_batches": float(micro_batches),
        "perf/optimizer_steps": float(len(grad_norms)),
    }
    if alg.dual_clip_c is not None:
        metrics["losses/dual_clipfrac"] = s["dual_clipped"] / s["trained"]
    if alg.is_mode == "mask":
        metrics["offpolicy/is_masked_frac"] = s["is_masked"] / s["trained"]
    if alg.entropy_coef:
        metrics["losses/entropy_bonus"] = s["entropy_bonus"] / updates
    if with_ref and not alg.kl_in_reward:
        metrics["losses/kl_ref"] = s["kl_ref"] / s["trained"]
    if alg.advantage == "ppo":
        metrics["losses/value_loss"] = s["value_loss"] / updates
        metrics["critic/vf_clipfrac"] = s["vf_clipped"] / s["trained"]
        metrics["critic/value_mean"] = s["value"] / s["trained"]
    return metrics


def _kl_penalties(batch: Batch, ref: dict[int, Tensor]) -> list[float]:
    """Each trajectory's summed KL estimate of the sampling policy (the engine's logprobs) to the
    reference over its trained tokens: what ``kl_in_reward`` charges to its reward."""
    alg = batch.cfg.algorithm
    out = []
    for i in range(len(batch.trajs)):
        behav = batch.per_token([i], "behavior_logprobs", torch.float32)
        out.append(float(kl_estimate(behav, ref[i], alg.kl_estimator).sum()))
    return out


def _gae(batch: Batch, rewards: list[float]) -> dict[str, float]:
    """Per-token GAE advantages and returns of every trajectory from the critic's values before the
    first update and its reward at its last agent token (tool output is not an action)."""
    alg = batch.cfg.algorithm
    for i, r in enumerate(rewards):
        adv, ret = agent_token_gae(batch.values_old[i].double().cpu(), r, gamma=alg.gamma, lam=alg.lam)
        batch.token_advantages[i], batch.returns[i] = adv.float(), ret.float()
    adv = torch.cat(list(batch.token_advantages.values()))
    return {
        "advantages/abs_mean": float(adv.abs().mean()),
        "critic/return_mean": float(torch.cat(list(batch.returns.values())).mean()),
        "critic/value_before_mean": float(torch.cat([v.float() for v in batch.values_old.values()]).mean()),
    }


def train_step(
    model: Any, optimizer: torch.optim.Optimizer, groups: Sequence[Sequence[Trajectory]], version: int,
    cfg: StepConfig, *, scheduler: Any = None, ref_model: Any = None, critic: Any = None,
    ctx: DistContext | None = None, abort: Any = None, record: dict[str, dict[str, Any]] | None = None,
) -> dict[str, float]:  # fmt: skip
    """Trains on ``groups``; returns metrics (nothing is updated when no group is usable).

    Args:
        model: a transformers causal LM (packing switches its attention implementation, see
            ``trainer.packing.enable_packed_attention``).
        optimizer: stepped ``cfg.ppo_epochs * cfg.minibatches`` times.
        groups: Trajectory groups, one per prompt.
        version: the policy version of ``model``'s weights.
        cfg: the step configuration; ``cfg.algorithm`` says what is optimised.
        scheduler: stepped after every optimizer step.
        ref_model: the reference policy of the KL term (``algorithm.kl_coef``; in the loss or in
            the reward) and ``losses/kl_ref``.
        critic: ``algorithm.advantage: ppo``: the value head (``trainer.critic.ValueHead``), trained
            with the policy; ``optimizer`` must hold its parameters too.
        ctx: under FSDP2, this rank (every rank calls ``train_step`` with the same groups).
        abort: a ``threading.Event``; set before the first optimizer step, the step raises
            ``StepAborted`` at its next micro-batch (or before that update) and changes nothing
            (one process only).
        record: a dict the step fills with each trained trajectory's per-token logprobs (the
            proximal ones) and advantage, by trajectory id, for the rollout log.
    """
    start = time.perf_counter()
    alg = cfg.algorithm
    if alg.kl_coef and ref_model is None:
        raise ValueError("algorithm.kl_coef > 0 needs ref_model")
    if (alg.advantage == "ppo") != (critic is not None):
        raise ValueError("a critic is used by, and needed for, algorithm.advantage ppo only")
    if critic is not None and ctx is not None and ctx.distributed:
        raise ValueError("algorithm.advantage ppo: the critic is not sharded; train in one process")
    used, rewards, group_ids, metrics = select_trajectories(groups, version, cfg)
    if not used:
        return metrics
    ctx = ctx or DistContext()
    device = next(model.parameters()).device
    batch = Batch(used, [], cfg, device, fused=cfg.fused_logprobs and not ctx.distributed)
    batch.critic, batch.abort, batch.record = critic, abort, record
    mode = enable_packed_attention(model) if cfg.packing else None
    batch.share = cfg.share_prefix and mode in ("varlen", "mask")
    mine = shard_of(list(range(len(used))), ctx, cost=lambda i: used[i].num_tokens)
    own = set(mine)
    one_pass = equalize_passes(batch.micro_batches(mine), ctx)
    metrics["perf/forward_tokens"] = float(sum(batch.row_tokens(m) for m in one_pass))
    # one epoch, one minibatch: a single update, so pi_prox is the training forward's own policy
    # (a critic needs its values before the first update: the advantages come from them)
    on_policy = cfg.ppo_epochs == 1 and cfg.minibatches == 1 and critic is None
    model.eval()  # no dropout: proximal and trained logprobs come from the same function
    sums: dict[str, Tensor] = {}
    with torch.no_grad(), autocast(device, cfg):
        prox, batch.values_old = (
            (None, {})
            if on_policy
            else proximal_logprobs(model, batch, one_pass, mode, sums, version, critic)
        )
        # a KL charged to the reward changes every advantage: every rank needs every trajectory's
        ref_passes = batch.micro_batches(list(range(len(used)))) if alg.kl_in_reward else one_pass
        ref = None if ref_model is None else reference_logprobs(ref_model, batch, ref_passes)
    if alg.kl_in_reward and ref is not None:
        penalties = _kl_penalties(batch, ref)
        rewards = [kl_penalized(r, k, alg.kl_coef) for r, k in zip(rewards, penalties, strict=True)]
        metrics["rewards/kl_penalty_mean"] = alg.kl_coef * sum(penalties) / len(penalties)
    if critic is None:
        batch.advantages = estimate_advantages(
            rewards, group_ids, alg.advantage, scale_by_std=alg.scale_by_std
        )
        metrics["advantages/abs_mean"] = sum(abs(a) for a in batch.advantages) / len(used)
    else:
        metrics |= _gae(batch, rewards)
    note_advantages(batch)

    grad_norms, normalizers = [], []
    for epoch in range(cfg.ppo_epochs):
        rng = np.random.default_rng([cfg.seed, version, epoch])
        for minibatch in np.array_split(rng.permutation(len(used)), min(cfg.minibatches, len(used))):
            grad_norm, normalizer = _minibatch_update(
                model, optimizer, scheduler, batch, minibatch, own, ctx, mode, sums,
                version=version, prox=prox, ref=ref,
            )  # fmt: skip
            grad_norms.append(grad_norm)
            normalizers.append(normalizer)
            batch.abort = None  # the weights changed: finish the step rather than leave it half done

    n_tokens = [len(p) for p in batch.positions]
    metrics |= step_metrics(
        sums, ctx, n_tokens, len(one_pass), grad_norms, normalizers, cfg, with_ref=ref_model is not None
    )
    elapsed = time.perf_counter() - start  # after the float() conversions above: the GPU is done
    metrics["perf/step_s"] = elapsed
    metrics["perf/tokens_per_s"] = sum(t.num_tokens for t in used) * cfg.ppo_epochs / elapsed
    return metrics
