"""One policy-gradient training step on Trajectory groups: the compute core of the trainer loop.

Input: groups of Trajectory records as read from the store. Output: the model updated
``ppo_epochs x minibatches`` times and the step's metrics, namespaced as in CleanRL. What is
optimised is ``cfg.algorithm`` (``trainer.config.AlgorithmConfig``). In order:

1. screening: trajectories whose oldest generated token is more than ``max_staleness`` versions
   behind the current one are dropped (counted, never silently), and, with ``filter_truncated``,
   those that ended at a token limit; groups whose (shaped) rewards are all equal carry no
   group-relative signal and are dropped (dynamic sampling), except under a batch-mean baseline;
2. rewards: the verifier's, plus the overlong penalty (``overlong_buffer``), minus
   ``kl_coef * sum_t KL_t`` with ``kl_in_reward``; advantages by ``algorithm.advantage`` (GRPO
   with or without the std, Dr.GRPO, RLOO, batch-mean REINFORCE), one per sequence, or PPO's:
   per-token GAE from a critic's values (``trainer.critic``) over the agent's own tokens;
3. proximal logprobs: recomputed under the current weights once, before the first update. With
   one epoch and one minibatch there is a single update, so pi_prox is exactly the policy of the
   training forward and its detached logprobs are used (no second forward pass); the behaviour
   logprobs come from the engine; reference logprobs (optional) from ``ref_model``;
4. loss: ``w * max(-A r, -A clip(r))`` with ``r = pi_theta / pi_prox`` (clip-higher, optional
   dual clip) and the single capped or masked, detached weight ``w = pi_prox / pi_behavior`` per
   token or per sequence (one weight covers both engine/trainer mismatch and staleness), minus
   ``entropy_coef * H``, plus ``kl_coef * KL(pi_theta || pi_ref)`` unless the KL is in the reward,
   plus ``vf_coef`` times the clipped value loss with a critic;
   per-token terms are averaged by ``loss_agg`` over the minibatch (each sequence's tokens carry
   the factor ``trainer.losses.sequence_weights`` gives it), gradients accumulated over
   micro-batches of at most ``micro_batch_tokens`` tokens;
5. per minibatch: clip the gradient norm, step the optimizer, then the scheduler.

Compute path: trajectories are packed end to end into rows without padding (``trainer.packing``),
and log-probabilities are computed only for mask-1 tokens, from the final hidden states, in
vocabulary chunks (``trainer.logprobs``); both can be switched off (``packing``,
``fused_logprobs``), giving the same numbers. On CUDA the forward runs under bf16 autocast.

Under FSDP2 (``ctx``, see ``trainer.distributed``) every rank passes the same groups; each trains
its share of the trajectories (balanced by tokens), divides by the global token count of the
minibatch, runs as many passes as the busiest rank (empty ones on a dummy row) and the step's
metric sums are added over ranks. The fused head is bypassed there: it reads ``lm_head.weight``
outside the root module's forward, where FSDP2 has not gathered it.

Deliberately left out here (the loop's job): reading from Redis, warm-up schedules (pass a
``scheduler``). A critic under FSDP2 (PPO trains in one process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pqrl.trajectory import Status, Trajectory
from trainer.advantages import agent_token_gae, estimate_advantages
from trainer.config import StepConfig
from trainer.distributed import DistContext, all_reduce_sums, equalize_passes, shard_of
from trainer.layers import checks_at_layers, trim_before_optimizer_step, trims_before_layer_backward
from trainer.logprobs import full_logprobs, has_plain_head, head_logprobs
from trainer.losses import (
    clipped_surrogate,
    clipped_value_loss,
    kl_estimate,
    sequence_weights,
    truncated_is_weights,
)
from trainer.packing import (
    enable_packed_attention,
    first_fit_decreasing,
    pack_row,
    packed_model_kwargs,
    prefix_key,
    share_prefixes,
    shared_rows,
)
from trainer.rewards import kl_penalized, overlong_penalty
from trainer.tied_embedding import rows_into_grad

__all__ = [
    "Screened",
    "StepAborted",
    "StepConfig",
    "ended_at_a_limit",
    "screen_group",
    "token_logprobs",
    "train_step",
    "trained_reward",
]


class StepAborted(Exception):
    """``train_step`` stopped on request before its first optimizer step: the weights, the optimizer
    and the scheduler are as they were, so the last checkpoint still describes them."""


def token_logprobs(model: Any, tokens: Tensor, attention_mask: Tensor, temperature: float) -> Tensor:
    """``[B, T]`` log-probability of each token given its prefix (position 0 gets 0)."""
    logits = model(input_ids=tokens, attention_mask=attention_mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(logp, (1, 0))


def _collate(trajs: Sequence[Trajectory], device: torch.device) -> dict[str, Tensor]:
    T = max(t.num_tokens for t in trajs)
    tokens = np.zeros((len(trajs), T), dtype=np.int64)
    mask = np.zeros((len(trajs), T), dtype=np.int64)
    for i, t in enumerate(trajs):
        tokens[i, : t.num_tokens] = t.tokens
        mask[i, : t.num_tokens] = 1
    return {
        "tokens": torch.from_numpy(tokens).to(device),
        "attention_mask": torch.from_numpy(mask).to(device),
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


def ended_at_a_limit(t: Trajectory) -> bool:
    """The episode hit the token budget, or its last turn was cut at the turn's token limit."""
    return t.status is Status.TRUNCATED or bool(t.turns and t.turns[-1].finish_reason == "length")


def trained_reward(t: Trajectory, cfg: StepConfig) -> float:
    """The reward the advantages see: the verifier's (already shaped by the task's own grader), plus
    DAPO's overlong penalty when it is on."""
    alg = cfg.algorithm
    if not alg.overlong_buffer or alg.context_tokens is None:
        return t.reward
    return t.reward + overlong_penalty(
        t.num_tokens, alg.context_tokens, alg.overlong_buffer, alg.overlong_penalty
    )


@dataclasses.dataclass(frozen=True)
class Screened:
    """One group as the step sees it: its trainable members and their trained rewards, why the whole
    group is dropped (None: it is used), the counts of dropped members, and the staleness (versions
    behind the current one) of every scored member."""

    valid: list[Trajectory]
    rewards: list[float]
    dropped: str | None
    counts: Counter[str]
    ages: list[int]


def screen_group(group: Sequence[Trajectory], version: int, cfg: StepConfig) -> Screened:
    """Which members of ``group`` the step at ``version`` trains on, and whether the group is used."""
    counts: Counter[str] = Counter()
    ages: list[int] = []
    valid = []
    for t in group:
        if t.status is Status.FAILED_INFRA or t.num_generated == 0:
            counts["dropped/failed_infra"] += 1
            continue
        age = version - int(t.versions[t.generated.astype(bool)].min())
        ages.append(age)
        if age > cfg.max_staleness:
            counts["dropped/stale"] += 1
            continue
        if cfg.algorithm.filter_truncated and ended_at_a_limit(t):
            counts["dropped/truncated"] += 1
            continue
        valid.append(t)
    rewards = [trained_reward(t, cfg) for t in valid]
    dropped = None
    if len(valid) < 2:
        dropped = "groups_too_few_valid"
    # every group-relative advantage would be 0 (DAPO dynamic sampling); a batch-mean baseline or
    # a critic still gives such a group a signal
    elif cfg.algorithm.advantage not in ("reinforce_baseline", "ppo") and len(set(rewards)) == 1:
        dropped = "no_signal_groups"
    return Screened(valid, rewards, dropped, counts, ages)


def _select(
    groups: Sequence[Sequence[Trajectory]], version: int, cfg: StepConfig
) -> tuple[list[Trajectory], list[float], list[int], dict[str, float]]:
    """The usable trajectories, their shaped rewards and group indices, and the counts of what was dropped."""
    counts: Counter[str] = Counter()
    staleness: Counter[int] = Counter()
    used: list[Trajectory] = []
    rewards: list[float] = []
    group_ids: list[int] = []
    for g, group in enumerate(groups):
        screened = screen_group(group, version, cfg)
        counts.update(screened.counts)
        staleness.update(screened.ages)
        if screened.dropped is not None:
            counts[f"dropped/{screened.dropped}"] += 1
            continue
        used += screened.valid
        rewards += screened.rewards
        group_ids += [g] * len(screened.valid)
    metrics: dict[str, float] = {k: float(v) for k, v in counts.items()}
    metrics |= {f"offpolicy/staleness_{k}": float(v) for k, v in sorted(staleness.items())}
    metrics["rollout/trajectories_used"] = float(len(used))
    if used and cfg.algorithm.overlong_buffer:
        metrics["rewards/overlong_penalty_mean"] = sum(
            r - t.reward for r, t in zip(rewards, used, strict=True)
        ) / len(used)
    return used, rewards, group_ids, metrics


class _Batch:
    """The trajectories of one step and, per trajectory, its trained positions (mask 1, t >= 1)."""

    def __init__(
        self, trajs: list[Trajectory], advantages: list[float], cfg: StepConfig, device: torch.device,
        fused: bool,
    ):  # fmt: skip
        self.trajs, self.cfg, self.device, self.fused = trajs, cfg, device, fused
        # position 0 has no prefix to predict it from
        self.positions = [np.flatnonzero(t.loss_mask[1:]) + 1 for t in trajs]
        # the prompt, up to the first trained token, may be stored once per row for all who share it
        self.shareable = [
            min(t.prompt_len, int(p[0])) if len(p) else 0 for t, p in zip(trajs, self.positions, strict=True)
        ]
        self.share = False  # set once the packed attention mode is known (it must support parents)
        self.abort: Any = None  # a threading.Event checked before each forward until the first update
        self.advantages = advantages
        # PPO: the critic, its values before the first update, and per-token advantages and returns
        self.critic: Any = None
        self.values_old: dict[int, Tensor] = {}
        self.token_advantages: dict[int, Tensor] = {}
        self.returns: dict[int, Tensor] = {}

    def micro_batches(self, members: Sequence[int]) -> list[list[int]]:
        trajs = [self.trajs[i] for i in members]
        if self.cfg.packing and self.share:
            keys = [prefix_key(t.tokens, self.shareable[i]) for t, i in zip(trajs, members, strict=True)]
            shared = [self.shareable[i] for i in members]
            rows = shared_rows([t.num_tokens for t in trajs], keys, shared, self.cfg.micro_batch_tokens)
        elif self.cfg.packing:
            rows = first_fit_decreasing([t.num_tokens for t in trajs], self.cfg.micro_batch_tokens)
        else:
            rows = _micro_batches(trajs, self.cfg.micro_batch_tokens)
        return [[members[j] for j in row] for row in rows]

    def per_token(self, members: Sequence[int], name: str, dtype: torch.dtype) -> Tensor:
        """A Trajectory array (or the advantage) at the trained positions of ``members``, concatenated."""
        if name == "advantages" and self.token_advantages:
            return torch.cat([self.token_advantages[i] for i in members]).to(self.device, dtype)
        if name == "advantages":
            return self.spread(members, dict(enumerate(self.advantages)), dtype)
        parts = [getattr(self.trajs[i], name)[self.positions[i]] for i in members]
        return torch.from_numpy(np.concatenate(parts)).to(self.device, dtype, non_blocking=True)

    def spread(self, members: Sequence[int], value: dict[int, float], dtype: torch.dtype) -> Tensor:
        """One number per member repeated over its trained positions, concatenated."""
        parts = [np.full(len(self.positions[i]), value[i]) for i in members]
        return torch.from_numpy(np.concatenate(parts)).to(self.device, dtype, non_blocking=True)

    def lengths(self, members: Sequence[int]) -> list[int]:
        return [len(self.positions[i]) for i in members]

    def row_tokens(self, members: Sequence[int]) -> int:
        """Tokens one forward over ``members`` computes (a shared prompt counts once)."""
        if not self.share:
            return sum(self.trajs[i].num_tokens for i in members)
        layout = share_prefixes([self.trajs[i].tokens for i in members], [self.shareable[i] for i in members])
        return sum(len(s) for s in layout.segments)


def _check_abort(batch: _Batch) -> None:
    if batch.abort is not None and batch.abort.is_set():
        raise StepAborted("stopped before the first optimizer step")


def _logprobs(
    model: Any, batch: _Batch, members: Sequence[int], mode: str | None, *, with_entropy: bool,
    critic: Any = None,
) -> tuple[Tensor, Tensor, Tensor | None]:  # fmt: skip
    """``(logp, entropy, values)`` of the trained tokens of ``members``, in member order, each
    ``[n]``; ``values`` (the critic's ``V(s_t)``, from the same hidden states) None without a critic."""
    cfg, device = batch.cfg, batch.device
    _check_abort(batch)
    trajs = [batch.trajs[i] for i in members]
    # the hidden state at position p - 1 predicts the token at p
    if mode is not None:  # one packed row, flattened
        tokens = [t.tokens for t in trajs]
        if batch.share and mode in ("varlen", "mask"):
            layout = share_prefixes(tokens, [batch.shareable[i] for i in members])
            row = pack_row(layout.segments, device, layout.parents)
            src = [layout.rows_of(j, batch.positions[i] - 1, row.offsets) for j, i in enumerate(members)]
        else:  # sequence k starts at offsets[k]
            row = pack_row(tokens, device)
            src = [s + batch.positions[i] - 1 for s, i in zip(row.offsets, members, strict=True)]
        kwargs = packed_model_kwargs(model, row, mode)
    else:  # padded [B, T], flattened: row b starts at b * T
        mb = _collate(trajs, device)
        kwargs = {"input_ids": mb["tokens"], "attention_mask": mb["attention_mask"], "use_cache": False}
        width = mb["tokens"].shape[1]
        src = [b * width + batch.positions[i] - 1 for b, i in enumerate(members)]
    src_t = torch.from_numpy(np.concatenate(src)).to(device)
    target = np.concatenate([t.tokens[batch.positions[i]] for t, i in zip(trajs, members, strict=True)])
    target = torch.from_numpy(target.astype(np.int64)).to(device)
    with _checks_abort_at_layers(model, batch):
        if batch.fused and has_plain_head(model):
            hidden = model.base_model(**kwargs).last_hidden_state
            h = hidden.reshape(-1, hidden.shape[-1])[src_t]
            logp, entropy = head_logprobs(
                model, h, target, temperature=cfg.temperature, chunk_tokens=cfg.logprob_chunk_tokens,
                compile=cfg.compile, with_entropy=with_entropy,
            )  # fmt: skip
        else:
            out = model(**kwargs, output_hidden_states=critic is not None)
            logits = out.logits
            logp, entropy = full_logprobs(
                logits.reshape(-1, logits.shape[-1])[src_t], target, cfg.temperature, with_entropy
            )
            if critic is not None:  # the last hidden state, after the final norm: what the head reads
                last = out.hidden_states[-1]
                h = last.reshape(-1, last.shape[-1])[src_t]
    return logp, entropy, None if critic is None else critic(h)


def _checks_abort_at_layers(model: Any, batch: _Batch) -> contextlib.AbstractContextManager[None]:
    """A stop asked for during the pass raises at the next decoder layer, forward or backward."""
    if batch.abort is None:
        return contextlib.nullcontext()
    return checks_at_layers(model, lambda: _check_abort(batch))


def _empty_pass(model: Any, device: torch.device) -> Tensor:
    """A forward on a 2-token dummy row, times 0: a rank with no micro-batch left runs it so that
    FSDP2's all-gathers and reduce-scatters pair up with the other ranks' passes."""
    logits = model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=device), use_cache=False).logits
    return logits.float().sum() * 0.0


def _full(t: Tensor) -> Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t  # a DTensor under FSDP2


# the step's metric sums, added over ranks
_SUMS = (
    "pg_loss", "clipped", "dual_clipped", "trained", "entropy", "entropy_bonus", "is_weight", "is_masked",
    "value_loss", "vf_clipped", "value",
    "tis_weight", "tis_weight_max", "tis_weight_clipped", "current_tokens", "mismatch_kl",
    "mismatch_tis_weight", "stale_tokens", "stale_kl", "stale_tis_weight", "staleness", "kl_ref",
)  # fmt: skip


def _autocast(
    device: torch.device, cfg: StepConfig, *, cache: bool = True
) -> contextlib.AbstractContextManager:
    """``cfg.dtype`` autocast where it is on. ``cache`` keeps each weight's low-precision copy until
    the context exits: worth it when a pass reuses the weights (the no-grad passes over every
    micro-batch). A training forward uses each weight once and, with gradient checkpointing,
    saves no copy for backward, so there the cache only held a second copy of the model
    (270 MB in bfloat16 for SmolLM2-135M) at the end of the forward."""
    on = device.type == "cuda" or (device.type == "cpu" and cfg.cpu_autocast)
    if not on or cfg.dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, cfg.dtype), cache_enabled=cache)


@contextlib.contextmanager
def _checkpointing(model: Any, on: bool) -> Iterator[None]:
    """Gradient checkpointing for the training forward, without dropout.

    transformers checkpoints only modules in training mode; only the flagged modules (layers, or
    the base model in older versions) are switched, not their children, so dropout stays off.
    """
    flagged = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    if not (on or flagged):  # a caller's gradient_checkpointing_enable() counts too
        yield
        return
    if not flagged:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        flagged = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    for m in flagged:
        m.training = True
    try:
        yield
    finally:
        for m in flagged:
            m.training = False


def _offpolicy_sums(
    prox: Tensor, behav: Tensor, versions: Tensor, version: int, cap: float
) -> dict[str, Tensor]:
    """Sums over tokens of the importance weight, split by engine mismatch (current version) and staleness."""
    w = truncated_is_weights(prox, behav, torch.ones_like(prox), cap=cap)
    current = (versions == version).float()
    stale = 1.0 - current
    k1 = behav - prox  # k1 estimate of KL(behaviour || prox)
    return {
        "tis_weight": w.sum(),
        "tis_weight_max": w.max(),
        "tis_weight_clipped": ((prox - behav) > math.log(cap)).sum() if cap else w.new_zeros(()),
        "current_tokens": current.sum(),
        "mismatch_kl": (k1 * current).sum(),
        "mismatch_tis_weight": (w * current).sum(),
        "stale_tokens": stale.sum(),
        "stale_kl": (k1 * stale).sum(),
        "stale_tis_weight": (w * stale).sum(),
        "staleness": (version - versions).float().sum(),
    }


def _add(sums: dict[str, Tensor], new: dict[str, Tensor]) -> None:
    """Accumulates on the device (one synchronisation at the end of the step, not one per micro-batch)."""
    for k, v in new.items():
        v = v.detach().float()
        if k not in sums:
            sums[k] = v
        else:
            sums[k] = torch.maximum(sums[k], v) if k.endswith("_max") else sums[k] + v


def _record_offpolicy(
    sums: dict[str, Tensor], batch: _Batch, members: list[int], logp_prox: Tensor, entropy: Tensor,
    version: int,
) -> None:  # fmt: skip
    """Adds the importance-weight sums of ``members`` under the proximal logprobs, and their entropy."""
    if logp_prox.numel() == 0:  # every loss mask of the micro-batch is 0
        return
    behav = batch.per_token(members, "behavior_logprobs", torch.float32)
    versions = batch.per_token(members, "versions", torch.long)
    _add(
        sums,
        _offpolicy_sums(logp_prox, behav, versions, version, batch.cfg.algorithm.is_cap)
        | {"entropy": entropy.sum()},
    )


def _by_member(batch: _Batch, members: list[int], logp: Tensor) -> dict[int, Tensor]:
    """The concatenated per-token ``logp`` of ``members``, split back into one tensor per member."""
    return dict(zip(members, logp.split([len(batch.positions[i]) for i in members]), strict=True))


def _proximal_logprobs(
    model: Any, batch: _Batch, one_pass: list[list[int]], mode: str | None, sums: dict[str, Tensor],
    version: int, critic: Any = None,
) -> tuple[dict[int, Tensor], dict[int, Tensor]]:  # fmt: skip
    """pi_prox of this rank's trained tokens, under the weights before the first update, per member,
    and the critic's values there (empty without a critic); adds the off-policy sums. An empty pass
    runs a dummy forward to pair up with the other ranks."""
    prox: dict[int, Tensor] = {}
    values: dict[int, Tensor] = {}
    for members in one_pass:
        if not members:
            _empty_pass(model, batch.device)
            continue
        logp, entropy, v = _logprobs(model, batch, members, mode, with_entropy=True, critic=critic)
        _record_offpolicy(sums, batch, members, logp, entropy, version)
        prox |= _by_member(batch, members, logp)
        if v is not None:
            values |= _by_member(batch, members, v)
    return prox, values


def _reference_logprobs(ref_model: Any, batch: _Batch, one_pass: list[list[int]]) -> dict[int, Tensor]:
    """pi_ref of this rank's trained tokens, per member."""
    ref_model.eval()
    ref_mode = enable_packed_attention(ref_model) if batch.cfg.packing else None
    ref: dict[int, Tensor] = {}
    for members in filter(None, one_pass):  # the reference model is not sharded
        logp, _, _ = _logprobs(ref_model, batch, members, ref_mode, with_entropy=False)
        ref |= _by_member(batch, members, logp)
    return ref


def _is_weights(batch: _Batch, members: list[int], logp_prox: Tensor, behav: Tensor) -> Tensor:
    """The off-policy weight of each trained token: per token, or one per member (its tokens' ratios
    multiplied), capped or masked as the algorithm says."""
    alg = batch.cfg.algorithm
    kw = {"cap": alg.is_cap, "mode": alg.is_mode}
    if alg.is_level == "token":
        return truncated_is_weights(logp_prox, behav, torch.ones_like(logp_prox), **kw)
    n = batch.lengths(members)
    return torch.cat([
        truncated_is_weights(p[None], b[None], torch.ones_like(p[None]), level="sequence", **kw)[0]
        for p, b in zip(logp_prox.split(n), behav.split(n), strict=True)
    ])  # fmt: skip


def _micro_batch_backward(
    model: Any, batch: _Batch, members: list[int], mode: str | None, weight: dict[int, float],
    sums: dict[str, Tensor], *, version: int, prox: dict[int, Tensor] | None,
    ref: dict[int, Tensor] | None,
) -> None:  # fmt: skip
    """Backpropagates one micro-batch's share of the minibatch loss (each member's token losses times
    its aggregation ``weight``) and adds its sums. ``prox`` None: on policy, pi_prox is the
    training forward's own (detached) policy; ``ref`` None: no KL loss term."""
    cfg, alg = batch.cfg, batch.cfg.algorithm
    with (
        _checkpointing(model, cfg.gradient_checkpointing),
        rows_into_grad(model),
        trims_before_layer_backward(model, batch.device),
    ):
        with _autocast(batch.device, cfg, cache=False):
            logp, entropy, values = _logprobs(
                model, batch, members, mode, with_entropy=prox is None or alg.entropy_coef > 0,
                critic=batch.critic,
            )  # fmt: skip
        if prox is None:
            logp_prox = logp.detach()
            _record_offpolicy(sums, batch, members, logp_prox, entropy, version)
        else:
            logp_prox = torch.cat([prox[i] for i in members])
        behav = batch.per_token(members, "behavior_logprobs", torch.float32)
        surrogate = clipped_surrogate(
            logp, logp_prox, batch.per_token(members, "advantages", torch.float32),
            eps_low=alg.eps_low, eps_high=alg.eps_high, dual_clip_c=alg.dual_clip_c,
        )  # fmt: skip
        is_w = _is_weights(batch, members, logp_prox, behav)
        w = batch.spread(members, weight, torch.float32)
        pg = (w * is_w * surrogate.loss).sum()
        loss = pg
        new = {
            "pg_loss": pg,
            "clipped": surrogate.clipped.sum(),
            "dual_clipped": surrogate.dual_clipped.sum(),
            "is_weight": is_w.sum(),
            "is_masked": (is_w == 0).sum(),
            "trained": logp.new_tensor(len(logp)),
        }
        if alg.entropy_coef:
            bonus = (w * entropy).sum()
            loss = loss - alg.entropy_coef * bonus
            new["entropy_bonus"] = bonus
        if ref is not None and not alg.kl_in_reward:
            kl = kl_estimate(logp, torch.cat([ref[i] for i in members]), alg.kl_estimator)
            loss = loss + alg.kl_coef * (w * kl).sum()
            new["kl_ref"] = kl.sum()
        if values is not None:
            per_token, clipped = clipped_value_loss(
                values, torch.cat([batch.values_old[i] for i in members]),
                torch.cat([batch.returns[i] for i in members]).to(values), alg.vf_clip,
            )  # fmt: skip
            value_loss = (w * per_token).sum()
            loss = loss + alg.vf_coef * value_loss
            new |= {"value_loss": value_loss, "vf_clipped": clipped.sum(), "value": values.detach().sum()}
        loss.backward()
    _add(sums, new)


def _aggregation(batch: _Batch, minibatch: Sequence[int]) -> tuple[dict[int, float], float]:
    """Each member's factor in the minibatch's loss (``trainer.losses.sequence_weights``) and the
    aggregation's denominator (tokens for token_mean, sequences, or sequences x the constant)."""
    alg = batch.cfg.algorithm
    members = list(minibatch)
    lengths = batch.lengths(members)
    weights = sequence_weights(lengths, alg.loss_agg, alg.agg_tokens)
    seqs = float(sum(1 for n in lengths if n > 0))
    normalizer = {"token_mean": float(sum(lengths)), "seq_mean_token_sum_norm": seqs * (alg.agg_tokens or 1)}
    return dict(zip(members, weights, strict=True)), normalizer.get(alg.loss_agg, seqs)


def _minibatch_update(
    model: Any, optimizer: torch.optim.Optimizer, scheduler: Any, batch: _Batch, minibatch: np.ndarray,
    own: set[int], ctx: DistContext, mode: str | None, sums: dict[str, Tensor], *, version: int,
    prox: dict[int, Tensor] | None, ref: dict[int, Tensor] | None,
) -> tuple[Tensor, float]:  # fmt: skip
    """One optimizer (and scheduler) step on this rank's share of ``minibatch``; returns the gradient
    norm before clipping and the aggregation's denominator."""
    cfg = batch.cfg
    # every rank weighs its members within the whole minibatch: the reduced gradient is the aggregate's
    weight, normalizer = _aggregation(batch, minibatch.tolist())
    optimizer.zero_grad(set_to_none=True)
    passes = batch.micro_batches(sorted(i for i in minibatch.tolist() if i in own))
    for members in equalize_passes(passes, ctx):
        if not members:
            with _checkpointing(model, cfg.gradient_checkpointing), _autocast(batch.device, cfg, cache=False):
                _empty_pass(model, batch.device).backward()
            continue
        _micro_batch_backward(model, batch, members, mode, weight, sums, version=version, prox=prox, ref=ref)
    _check_abort(batch)  # the last chance before the weights change
    params = list(model.parameters()) + ([] if batch.critic is None else list(batch.critic.parameters()))
    grad_norm = _full(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
    trim_before_optimizer_step(batch.device)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # applied: freed now, not held while the trainer waits
    if scheduler is not None:
        scheduler.step()
    return grad_norm, normalizer


def _step_metrics(
    sums: dict[str, Tensor], ctx: DistContext, n_tokens: list[int], micro_batches: int,
    grad_norms: list[Tensor], normalizers: list[float], cfg: StepConfig, with_ref: bool,
) -> dict[str, float]:  # fmt: skip
    """The step's loss, policy, off-policy and perf metrics from its sums, added over ranks."""
    alg = cfg.algorithm
    s = Counter(all_reduce_sums({k: float(v) for k, v in sums.items()}, _SUMS, ctx))
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


def _kl_penalties(batch: _Batch, ref: dict[int, Tensor]) -> list[float]:
    """Each trajectory's summed KL estimate of the sampling policy (the engine's logprobs) to the
    reference over its trained tokens: what ``kl_in_reward`` charges to its reward."""
    alg = batch.cfg.algorithm
    out = []
    for i in range(len(batch.trajs)):
        behav = batch.per_token([i], "behavior_logprobs", torch.float32)
        out.append(float(kl_estimate(behav, ref[i], alg.kl_estimator).sum()))
    return out


def _gae(batch: _Batch, rewards: list[float]) -> dict[str, float]:
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
    ctx: DistContext | None = None, abort: Any = None,
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
    """
    start = time.perf_counter()
    alg = cfg.algorithm
    if alg.kl_coef and ref_model is None:
        raise ValueError("algorithm.kl_coef > 0 needs ref_model")
    if (alg.advantage == "ppo") != (critic is not None):
        raise ValueError("a critic is used by, and needed for, algorithm.advantage ppo only")
    if critic is not None and ctx is not None and ctx.distributed:
        raise ValueError("algorithm.advantage ppo: the critic is not sharded; train in one process")
    used, rewards, group_ids, metrics = _select(groups, version, cfg)
    if not used:
        return metrics
    ctx = ctx or DistContext()
    device = next(model.parameters()).device
    batch = _Batch(used, [], cfg, device, fused=cfg.fused_logprobs and not ctx.distributed)
    batch.critic, batch.abort = critic, abort
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
    with torch.no_grad(), _autocast(device, cfg):
        prox, batch.values_old = (
            (None, {})
            if on_policy
            else _proximal_logprobs(model, batch, one_pass, mode, sums, version, critic)
        )
        # a KL charged to the reward changes every advantage: every rank needs every trajectory's
        ref_passes = batch.micro_batches(list(range(len(used)))) if alg.kl_in_reward else one_pass
        ref = None if ref_model is None else _reference_logprobs(ref_model, batch, ref_passes)
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
    metrics |= _step_metrics(
        sums, ctx, n_tokens, len(one_pass), grad_norms, normalizers, cfg, with_ref=ref_model is not None
    )
    elapsed = time.perf_counter() - start  # after the float() conversions above: the GPU is done
    metrics["perf/step_s"] = elapsed
    metrics["perf/tokens_per_s"] = sum(t.num_tokens for t in used) * cfg.ppo_epochs / elapsed
    return metrics
