"""One optimizer step built up group by group as the groups arrive (``train.stream``).

A step of ``train_step`` starts once all its groups are in, so the trainer idles while the last
ones generate, then trains all of them while their places in the staleness gate stay taken: the
gate opens only when the new version is published. ``StreamingStep`` backpropagates each group's
share of the loss as soon as it is read, so the step ends one group's backward (and the optimizer
step) after its last group arrives, and the gate reopens that much sooner.

It is the same update, made by the step's own pieces (``trainer.screening``, ``trainer.batch``,
``trainer.step``): streaming changes when they run, not what they do. The step's loss is
``sum_i w_i sum_t loss_it`` with ``w_i = f_i / D`` (``trainer.objective.aggregation``): ``f_i``
depends on sequence ``i`` alone
(1, or ``1 / n_i`` for seq_mean_token_mean) and ``D`` on the whole step (its trained tokens, its
sequences, or sequences x agg_tokens for seq_mean_token_sum_norm), but ``D`` is a sum over
groups. Each group is backpropagated with the factors ``f_i`` and the accumulated gradient is divided by ``D``
once every group is in, before clipping; pi_prox is the training forward's own detached policy as
in a one-update ``train_step``. Group-relative advantages (grpo, dr_grpo, rloo) need only the
group. Only such steps stream (``streamable`` says why one does not): several updates per step
would need every group before the first, a batch-mean baseline or a critic's values likewise, and
a reference model or sharded ranks are left to ``train_step``.

The metrics are ``train_step``'s, except that ``perf/step_s``, ``perf/train_s`` and
``perf/tokens_per_s`` count computing time only (not the waits between arrivals) and
``perf/micro_batches`` and ``perf/forward_tokens`` count each arrival's own passes.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from pqrl.trajectory import Trajectory
from trainer.advantages import estimate_advantages
from trainer.batch import Batch, check_abort, full_tensor
from trainer.config import StepConfig
from trainer.distributed import DistContext
from trainer.packing import enable_packed_attention
from trainer.rollout_log import note_advantages
from trainer.screening import select_trajectories
from trainer.step import micro_batch_backward, step_metrics

__all__ = ["GROUP_RELATIVE", "StreamingStep", "streamable"]

GROUP_RELATIVE = ("grpo", "dr_grpo", "rloo")  # advantages computed from the group alone
_MEANS = ("rewards/overlong_penalty_mean",)  # per-trajectory means among select_trajectories' metrics
_WEIGHTED = ("pg_loss", "entropy_bonus")  # sums that carry the loss factors w_i


def streamable(
    cfg: StepConfig, *, ref_model: Any = None, critic: Any = None, sharded: bool = False
) -> str | None:
    """None when a step of ``cfg`` can be accumulated group by group; otherwise why not."""
    if cfg.ppo_epochs != 1 or cfg.minibatches != 1:
        return "several optimizer steps per step (ppo_epochs or minibatches above 1) need every group first"
    if cfg.algorithm.advantage not in GROUP_RELATIVE:
        return f"advantage {cfg.algorithm.advantage!r} is not computed from the group alone"
    if critic is not None or ref_model is not None or cfg.algorithm.kl_coef:
        return "a critic or a reference model (kl_coef) is left to the batch step"
    if sharded:
        return "sharded (FSDP2) ranks train the step's groups together"
    return None


class StreamingStep:
    """``add`` groups as they arrive, then ``finish``: the update ``train_step`` would make on all
    of them at once (one epoch, one minibatch), and its metrics.

    Args:
        abort: a ``threading.Event``; once set, the next micro-batch (or ``finish``) raises
            ``StepAborted`` and the weights are left as they were (the accumulated gradients are
            dropped by the next step).
        record: as ``train_step``'s, filled group by group.
    """

    def __init__(
        self, model: Any, optimizer: torch.optim.Optimizer, version: int, cfg: StepConfig, *,
        scheduler: Any = None, abort: Any = None, record: dict[str, dict[str, Any]] | None = None,
    ) -> None:  # fmt: skip
        if (why := streamable(cfg)) is not None:
            raise ValueError(f"this step cannot stream: {why}")
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.version, self.cfg, self.abort, self.record = version, cfg, abort, record
        self.device = next(model.parameters()).device
        self.mode = enable_packed_attention(model) if cfg.packing else None
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: Counter[str] = Counter()  # select_trajectories' counts, and the sums behind its means
        self.n_tokens: list[int] = []  # trained positions per trajectory
        self.normalizer = 0.0  # D: the sum over groups of each one's aggregation denominator
        self.micro_batches = 0
        self.forward_tokens = 0
        self.abs_advantages = 0.0
        self.tokens = 0  # the usable trajectories' tokens (perf/tokens_per_s)
        self.busy_s = 0.0  # time spent computing, not waiting for groups
        optimizer.zero_grad(set_to_none=True)  # a step cancelled while it waited left its gradients

    def add(self, groups: Sequence[Sequence[Trajectory]]) -> None:
        """Screens ``groups`` as ``train_step`` would and backpropagates the usable ones' share of
        the step's loss; groups it drops are counted in the metrics."""
        start = time.perf_counter()
        used, rewards, group_ids, metrics = select_trajectories(groups, self.version, self.cfg)
        n_used = metrics["rollout/trajectories_used"]
        self.counts.update({k: v * (n_used if k in _MEANS else 1) for k, v in metrics.items()})
        if used:
            self._backward(used, rewards, group_ids)
        self.busy_s += time.perf_counter() - start

    def _backward(self, used: list[Trajectory], rewards: list[float], group_ids: list[int]) -> None:
        cfg, alg = self.cfg, self.cfg.algorithm
        batch = Batch(used, [], cfg, self.device, fused=cfg.fused_logprobs)
        batch.abort, batch.record = self.abort, self.record
        batch.share = cfg.share_prefix and self.mode in ("varlen", "mask")
        batch.advantages = estimate_advantages(
            rewards, group_ids, alg.advantage, scale_by_std=alg.scale_by_std
        )
        note_advantages(batch)
        self.abs_advantages += sum(abs(a) for a in batch.advantages)
        members = list(range(len(used)))
        weight, normalizer = batch.aggregation(members)
        f = {i: w * normalizer for i, w in weight.items()}  # w_i without this group's share of D
        self.normalizer += normalizer
        self.model.eval()  # no dropout: pi_prox is the training forward's own policy
        passes = batch.micro_batches(members)
        for row in passes:
            micro_batch_backward(
                self.model, batch, row, self.mode, f, self.sums, version=self.version, prox=None, ref=None
            )
        self.micro_batches += len(passes)
        self.forward_tokens += sum(batch.row_tokens(m) for m in passes)
        self.n_tokens += [len(p) for p in batch.positions]
        self.tokens += sum(t.num_tokens for t in used)

    def finish(self) -> dict[str, float]:
        """Divides the gradient by ``D``, clips it, steps the optimizer (and scheduler); returns the
        step's metrics, named as ``train_step``'s. Nothing is updated when no group was usable."""
        start = time.perf_counter()
        metrics = {k: float(v) for k, v in self.counts.items()}
        used = metrics.get("rollout/trajectories_used", 0.0)
        for k in _MEANS:
            if k in metrics:
                metrics[k] /= max(used, 1.0)
        if not used:
            return metrics
        check_abort(self)
        params = [p for p in self.model.parameters() if p.grad is not None]
        scale = 1.0 / max(self.normalizer, 1e-12)
        for p in params:
            p.grad.mul_(scale)
        grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        for k in _WEIGHTED:
            if k in self.sums:
                self.sums[k] = self.sums[k] * scale
        metrics["advantages/abs_mean"] = self.abs_advantages / used
        metrics |= step_metrics(self.sums, DistContext(), self.n_tokens, self.micro_batches, [grad_norm],
                                 [self.normalizer], self.cfg, with_ref=False)  # fmt: skip
        metrics["perf/forward_tokens"] = float(self.forward_tokens)
        self.busy_s += time.perf_counter() - start
        metrics["perf/step_s"] = self.busy_s
        metrics["perf/tokens_per_s"] = self.tokens / self.busy_s
        return metrics
