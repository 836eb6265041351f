"""The trajectories of one training step on the device: micro-batches, forwards, logprob passes.

``Batch`` holds a step's trajectories and, per trajectory, its trained positions (mask 1, t >= 1),
and cuts them into micro-batches of at most ``micro_batch_tokens`` tokens. ``forward_logprobs``
computes the log-probability (and entropy, and a critic's value) of the trained tokens of one
micro-batch; ``proximal_logprobs`` and ``reference_logprobs`` run it without gradient over a
whole pass, for pi_prox before the first update and for pi_ref.

Compute path: trajectories are packed end to end into rows without padding (``trainer.packing``),
and log-probabilities are computed only for mask-1 tokens, from the final hidden states, in
vocabulary chunks (``trainer.logprobs``); both can be switched off (``packing``,
``fused_logprobs``), giving the same numbers. On CUDA the forward runs under bf16 autocast
(``autocast``). The fused head is bypassed under FSDP2: it reads ``lm_head.weight`` outside the
root module's forward, where FSDP2 has not gathered it.

A step asked to stop (``Batch.abort``) raises ``StepAborted`` at the next forward or decoder layer,
until its first optimizer step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pqrl.trajectory import Trajectory
from trainer.config import StepConfig
from trainer.layers import checks_at_layers
from trainer.logprobs import full_logprobs, has_plain_head, head_logprobs
from trainer.lora import base_only
from trainer.objective import aggregation, offpolicy_sums
from trainer.packing import (
    enable_packed_attention,
    first_fit_decreasing,
    pack_row,
    packed_model_kwargs,
    prefix_key,
    share_prefixes,
    shared_rows,
)
from trainer.rollout_log import note_logprobs

__all__ = [
    "Batch",
    "StepAborted",
    "add_sums",
    "autocast",
    "check_abort",
    "checkpointing",
    "empty_pass",
    "forward_logprobs",
    "full_tensor",
    "proximal_logprobs",
    "record_offpolicy",
    "reference_logprobs",
]


class StepAborted(Exception):
    """``train_step`` stopped on request before its first optimizer step: the weights, the optimizer
    and the scheduler are as they were, so the last checkpoint still describes them."""


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


class Batch:
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
        # the rollout log's: trajectory id -> the trainer's logprobs and advantage (None: not kept)
        self.record: dict[str, dict[str, Any]] | None = None

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

    def aggregation(self, minibatch: Sequence[int]) -> tuple[dict[int, float], float]:
        """Each member's factor in ``minibatch``'s loss and the aggregation's denominator
        (``trainer.objective.aggregation``)."""
        members = list(minibatch)
        weights, normalizer = aggregation(self.lengths(members), self.cfg.algorithm)
        return dict(zip(members, weights, strict=True)), normalizer

    def row_tokens(self, members: Sequence[int]) -> int:
        """Tokens one forward over ``members`` computes (a shared prompt counts once)."""
        if not self.share:
            return sum(self.trajs[i].num_tokens for i in members)
        layout = share_prefixes([self.trajs[i].tokens for i in members], [self.shareable[i] for i in members])
        return sum(len(s) for s in layout.segments)


def check_abort(step: Any) -> None:
    """Raises ``StepAborted`` once ``step.abort`` (a ``threading.Event`` or None) is set."""
    if step.abort is not None and step.abort.is_set():
        raise StepAborted("stopped before the first optimizer step")


def forward_logprobs(
    model: Any, batch: Batch, members: Sequence[int], mode: str | None, *, with_entropy: bool,
    critic: Any = None,
) -> tuple[Tensor, Tensor, Tensor | None]:  # fmt: skip
    """``(logp, entropy, values)`` of the trained tokens of ``members``, in member order, each
    ``[n]``; ``values`` (the critic's ``V(s_t)``, from the same hidden states) None without a critic."""
    cfg, device = batch.cfg, batch.device
    check_abort(batch)
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
    ids = np.concatenate([t.tokens[batch.positions[i]] for t, i in zip(trajs, members, strict=True)])
    target = torch.from_numpy(ids.astype(np.int64)).to(device)
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


def _checks_abort_at_layers(model: Any, batch: Batch) -> contextlib.AbstractContextManager[None]:
    """A stop asked for during the pass raises at the next decoder layer, forward or backward."""
    if batch.abort is None:
        return contextlib.nullcontext()
    return checks_at_layers(model, lambda: check_abort(batch))


def empty_pass(model: Any, device: torch.device) -> Tensor:
    """A forward on a 2-token dummy row, times 0: a rank with no micro-batch left runs it so that
    FSDP2's all-gathers and reduce-scatters pair up with the other ranks' passes."""
    logits = model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=device), use_cache=False).logits
    return logits.float().sum() * 0.0


def full_tensor(t: Tensor) -> Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t  # a DTensor under FSDP2


def autocast(
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
def checkpointing(model: Any, on: bool) -> Iterator[None]:
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


def add_sums(sums: dict[str, Tensor], new: dict[str, Tensor]) -> None:
    """Accumulates on the device (one synchronisation at the end of the step, not one per micro-batch)."""
    for k, v in new.items():
        v = v.detach().float()
        if k not in sums:
            sums[k] = v
        else:
            sums[k] = torch.maximum(sums[k], v) if k.endswith("_max") else sums[k] + v


def record_offpolicy(
    sums: dict[str, Tensor], batch: Batch, members: list[int], logp_prox: Tensor, entropy: Tensor,
    version: int,
) -> None:  # fmt: skip
    """Adds the importance-weight sums of ``members`` under the proximal logprobs, and their entropy."""
    if logp_prox.numel() == 0:  # every loss mask of the micro-batch is 0
        return
    note_logprobs(batch, members, logp_prox)
    behav = batch.per_token(members, "behavior_logprobs", torch.float32)
    versions = batch.per_token(members, "versions", torch.long)
    add_sums(
        sums,
        offpolicy_sums(logp_prox, behav, versions, version, batch.cfg.algorithm.is_cap)
        | {"entropy": entropy.sum()},
    )


def _by_member(batch: Batch, members: list[int], logp: Tensor) -> dict[int, Tensor]:
    """The concatenated per-token ``logp`` of ``members``, split back into one tensor per member."""
    return dict(zip(members, logp.split([len(batch.positions[i]) for i in members]), strict=True))


def proximal_logprobs(
    model: Any, batch: Batch, one_pass: list[list[int]], mode: str | None, sums: dict[str, Tensor],
    version: int, critic: Any = None,
) -> tuple[dict[int, Tensor], dict[int, Tensor]]:  # fmt: skip
    """pi_prox of this rank's trained tokens, under the weights before the first update, per member,
    and the critic's values there (empty without a critic); adds the off-policy sums. An empty pass
    runs a dummy forward to pair up with the other ranks."""
    prox: dict[int, Tensor] = {}
    values: dict[int, Tensor] = {}
    for members in one_pass:
        if not members:
            empty_pass(model, batch.device)
            continue
        logp, entropy, v = forward_logprobs(model, batch, members, mode, with_entropy=True, critic=critic)
        record_offpolicy(sums, batch, members, logp, entropy, version)
        prox |= _by_member(batch, members, logp)
        if v is not None:
            values |= _by_member(batch, members, v)
    return prox, values


def reference_logprobs(ref_model: Any, batch: Batch, one_pass: list[list[int]]) -> dict[int, Tensor]:
    """pi_ref of this rank's trained tokens, per member."""
    ref_model.eval()
    ref_mode = enable_packed_attention(ref_model) if batch.cfg.packing else None
    ref: dict[int, Tensor] = {}
    with base_only(ref_model):  # a LoRA policy is its own reference, adapters off
        for members in filter(None, one_pass):  # the reference model is not sharded
            logp, _, _ = forward_logprobs(ref_model, batch, members, ref_mode, with_entropy=False)
            ref |= _by_member(batch, members, logp)
    return ref
