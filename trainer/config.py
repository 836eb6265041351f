"""The trainer's settings, declared once: the job config, ``pqrl train --explain`` and the tests all
build these. Standard library only, so reading a job config imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pqrl.settings import Settings, setting

__all__ = ["LoopConfig", "StepConfig"]


@dataclass(frozen=True, kw_only=True)
class StepConfig(Settings):
    """One training step. ``temperature`` and ``max_staleness`` belong to the rollouts (the job passes
    the episode's temperature and the gate's staleness bound), so they have no default here."""

    temperature: float = setting(
        description="the rollouts' sampling temperature: logprobs are log_softmax(logits / T)", gt=0
    )
    max_staleness: int = setting(description="drop trajectories older than this many versions", ge=0)
    eps_low: float = setting(0.2, "clip range below 1", ge=0)
    eps_high: float = setting(0.28, "clip range above 1 (DAPO clip-higher)", ge=0)
    is_cap: float = setting(2.0, "C: cap of the single off-policy weight min(pi_prox / pi_behavior, C)", gt=0)
    max_grad_norm: float = setting(1.0, "gradient-norm clip per optimizer step", gt=0)
    micro_batch_tokens: int = setting(
        8192, "tokens per packed micro-batch (rows x longest without packing)", ge=1
    )
    ppo_epochs: int = setting(1, "K: passes over each step's trajectories", ge=1)
    minibatches: int = setting(
        1, "optimizer steps per pass, each on a random share of the trajectories", ge=1
    )
    packing: bool = setting(True, "pack sequences end to end into rows (no padding)")
    fused_logprobs: bool = setting(True, "logprobs from hidden states in vocabulary chunks (no full logits)")
    logprob_chunk_tokens: int = setting(2048, "tokens per chunk of the fused logprob computation", ge=1)
    compile: bool = setting(False, "torch.compile the vocabulary math (CUDA only)")
    dtype: Literal["bfloat16", "float16", "float32"] = setting(
        "bfloat16", "autocast dtype on CUDA (float32: none)"
    )
    gradient_checkpointing: bool = setting(False, "recompute activations in backward")
    kl_coef: float = setting(
        0.0, "weight of the KL term to the reference model (0: off; needs ref_model)", ge=0
    )
    kl_estimator: Literal["k1", "k2", "k3"] = setting(
        "k3", "KL estimator: k1 log-ratio, k2 half squared, k3 unbiased low-variance"
    )
    seed: int = setting(0, "minibatch shuffling seed, mixed with the version and the epoch")


@dataclass(frozen=True, kw_only=True)
class LoopConfig(Settings):
    """The trainer loop around ``train_step``: what it reads per step, where weights and checkpoints go."""

    step: StepConfig = setting(description="the training step")
    groups_per_step: int = setting(4, "groups consumed per outer step", ge=1)
    # DAPO dynamic sampling: read more groups while fewer than groups_per_step carry signal
    max_extra_reads: int = setting(
        3, "dynamic sampling: extra reads while fewer than groups_per_step groups carry signal", ge=0
    )
    keep_weights: int = setting(2, "published weight directories kept on disk", ge=1)
    read_block_ms: int = setting(1000, "how long one read of the stream blocks", ge=1)
    weights_dir: str = setting("runs/weights", "where published weights are saved")
    ckpt_dir: str | None = setting(
        None, "checkpoints; empty: acknowledge each step's groups at once (no resume)"
    )
    keep_checkpoints: int = setting(2, "checkpoints kept on disk", ge=1)
    consumer: str = setting("trainer-0", "fixed per trainer rank: a restart finds its own pending groups")
