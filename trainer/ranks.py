"""Rank 0 leads, the other ranks follow: the trainer's collective operations in lock step.

Under ``torchrun`` only rank 0 talks to Redis and the engines (``trainer.loop``). Every operation
that needs all ranks (a training step, gathering whole weights for publication or a checkpoint)
starts with rank 0 broadcasting its code; the followers sit in ``follow`` and run their side of it.
A rank that dies takes the job down with it: torchrun stops the others, and the job resumes from
its last checkpoint like a single-process one.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import torch

from pqrl.trajectory import Trajectory
from trainer.config import StepConfig
from trainer.distributed import (
    DistContext,
    broadcast_groups,
    broadcast_int,
    full_model_state,
    full_optimizer_state,
)
from trainer.step import train_step

__all__ = ["Leader", "Op", "follow"]


class Op(enum.IntEnum):
    STEP = 1
    MODEL_STATE = 2
    OPTIMIZER_STATE = 3
    STOP = 4


class Leader:
    """Rank 0's side of each operation: announce it, then take part."""

    def __init__(self, ctx: DistContext) -> None:
        if not ctx.is_main:
            raise ValueError("only rank 0 leads")
        self.ctx = ctx

    def train(
        self, model: Any, optimizer: torch.optim.Optimizer, groups: Sequence[Sequence[Trajectory]],
        version: int, cfg: StepConfig, **kwargs: Any,
    ) -> dict[str, float]:  # fmt: skip
        broadcast_int(Op.STEP, self.ctx)
        groups = broadcast_groups(groups, self.ctx)
        broadcast_int(version, self.ctx)
        return train_step(model, optimizer, groups, version, cfg, ctx=self.ctx, **kwargs)

    def model_state(self, model: Any) -> dict[str, torch.Tensor]:
        broadcast_int(Op.MODEL_STATE, self.ctx)
        state = full_model_state(model, self.ctx)
        assert state is not None
        return state

    def optimizer_state(self, model: Any, optimizer: torch.optim.Optimizer) -> Any:
        broadcast_int(Op.OPTIMIZER_STATE, self.ctx)
        return full_optimizer_state(model, optimizer, self.ctx)

    def stop(self) -> None:
        broadcast_int(Op.STOP, self.ctx)


def follow(
    model: Any, optimizer: torch.optim.Optimizer, cfg: StepConfig, ctx: DistContext, **kwargs: Any
) -> int:
    """A follower's whole life: run each operation rank 0 announces until it says stop; returns the
    number of training steps taken. ``kwargs`` go to ``train_step`` (scheduler, ref_model)."""
    steps = 0
    while True:
        op = Op(broadcast_int(None, ctx))
        if op is Op.STEP:
            groups = broadcast_groups(None, ctx)
            version = broadcast_int(None, ctx)
            train_step(model, optimizer, groups, version, cfg, ctx=ctx, **kwargs)
            steps += 1
        elif op is Op.MODEL_STATE:
            full_model_state(model, ctx)
        elif op is Op.OPTIMIZER_STATE:
            full_optimizer_state(model, optimizer, ctx)
        else:
            return steps
