"""The trainer's settings, declared once: the job config, ``pqrl train --explain`` and the tests all
build these. Standard library only, so reading a job config imports no torch."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from pqrl.settings import Settings, setting

__all__ = ["AlgorithmConfig", "LoopConfig", "StepConfig"]


@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig(Settings):
    """What the step optimises: the advantage estimator, how per-token losses are averaged, the
    trust region, the off-policy weight, the regularisers and the reward shaping. Defaults are
    GRPO with DAPO's token mean, clip-higher and a token-level capped weight."""

    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_baseline", "ppo"] = setting(
        "grpo",
        "advantage estimator: group mean (and std) baseline, leave-one-out, batch mean, or a critic with GAE",
    )
    scale_by_std: bool = setting(True, "grpo: divide by the group's reward std (false: mean-centred only)")
    loss_agg: Literal[
        "token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"
    ] = setting(
        "token_mean",
        "averaging of per-token losses: over all tokens, or per sequence (sum, mean, or sum over"
        " a constant: Dr.GRPO) then over sequences",
    )
    loss_agg_tokens: int | None = setting(
        None, "seq_mean_token_sum_norm: the constant divisor (default: the episode token budget)", ge=1
    )
    gamma: float = setting(1.0, "ppo: discount per agent token", ge=0, le=1)
    lam: float = setting(0.95, "ppo: GAE lambda (1: Monte-Carlo returns minus V, 0: one-step TD)", ge=0, le=1)
    vf_coef: float = setting(0.5, "ppo: weight of the value loss", gt=0)
    vf_clip: float | None = setting(
        0.2, "ppo: clip of the value change around the old value (empty: none)", gt=0
    )
    eps_low: float = setting(0.2, "clip range below 1", ge=0)
    eps_high: float = setting(0.28, "clip range above 1 (DAPO clip-higher)", ge=0)
    dual_clip_c: float | None = setting(
        None, "dual clip: cap the loss of A < 0 tokens at -c * A (c > 1)", gt=1
    )
    is_cap: float = setting(2.0, "C: cap of the single off-policy weight min(pi_prox / pi_behavior, C)", gt=0)
    is_level: Literal["token", "sequence"] = setting(
        "token", "off-policy weight per token, or one per sequence (product of its token ratios)"
    )
    is_mode: Literal["truncate", "mask", "off"] = setting(
        "truncate",
        "a weight above the cap: clipped to it, or the token / sequence dropped; off: no weight"
        " (every token 1: the engine's numerics and staleness left uncorrected, for ablations)",
    )
    kl_coef: float = setting(
        0.0, "weight of the KL to the reference model (0: off; loads the reference)", ge=0
    )
    kl_estimator: Literal["k1", "k2", "k3"] = setting(
        "k3", "KL estimator: k1 log-ratio, k2 half squared, k3 unbiased low-variance"
    )
    kl_in_reward: bool = setting(
        False, "subtract kl_coef * sum of the sequence's KL estimate from its reward instead of adding a loss"
    )
    entropy_coef: float = setting(0.0, "entropy bonus: minus this times the aggregated entropy", ge=0)
    overlong_buffer: int = setting(
        0, "DAPO overlong shaping: tokens before the budget where a linear penalty starts (0: off)", ge=0
    )
    overlong_penalty: float = setting(
        1.0, "the penalty at the budget (reaches it linearly over the buffer)", ge=0
    )
    filter_truncated: bool = setting(
        False, "leave out episodes that hit the token budget (DAPO overlong filter)"
    )
    context_tokens: int | None = setting(
        None, "the episode token budget (the job passes rollout.max_total_tokens)", ge=1
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        problems = []
        ppo_only = ("gamma", "lam", "vf_coef", "vf_clip")
        changed = [f.name for f in fields(self) if f.name in ppo_only and getattr(self, f.name) != f.default]
        if changed and self.advantage != "ppo":
            problems.append(f"{', '.join(changed)} apply to advantage ppo only")
        if not self.scale_by_std and self.advantage != "grpo":
            problems.append(f"scale_by_std applies to grpo only, not {self.advantage}")
        if self.kl_in_reward and not self.kl_coef:
            problems.append("kl_in_reward needs kl_coef > 0")
        budget = self.context_tokens
        if self.loss_agg == "seq_mean_token_sum_norm" and self.loss_agg_tokens is None and budget is None:
            problems.append("seq_mean_token_sum_norm needs loss_agg_tokens (or the episode budget)")
        if self.loss_agg_tokens is not None and self.loss_agg != "seq_mean_token_sum_norm":
            problems.append("loss_agg_tokens applies to loss_agg seq_mean_token_sum_norm only")
        if self.overlong_buffer and (budget is None or self.overlong_buffer >= budget):
            problems.append(
                f"overlong_buffer ({self.overlong_buffer}) must be below the token budget ({budget})"
            )
        if problems:
            raise ValueError("AlgorithmConfig: " + "; ".join(problems))

    @property
    def agg_tokens(self) -> int | None:
        """The constant divisor of ``seq_mean_token_sum_norm``."""
        return self.loss_agg_tokens if self.loss_agg_tokens is not None else self.context_tokens


@dataclass(frozen=True, kw_only=True)
class StepConfig(Settings):
    """One training step. ``temperature`` and ``max_staleness`` belong to the rollouts (the job passes
    the episode's temperature and the gate's staleness bound), so they have no default here."""

    temperature: float = setting(
        description="the rollouts' sampling temperature: logprobs are log_softmax(logits / T)", gt=0
    )
    max_staleness: int = setting(description="drop trajectories older than this many versions", ge=0)
    algorithm: AlgorithmConfig = setting(factory=AlgorithmConfig, description="what the step optimises")
    max_grad_norm: float = setting(1.0, "gradient-norm clip per optimizer step", gt=0)
    micro_batch_tokens: int = setting(
        8192, "tokens per packed micro-batch (rows x longest without packing)", ge=1
    )
    ppo_epochs: int = setting(1, "K: passes over each step's trajectories", ge=1)
    minibatches: int = setting(
        1, "optimizer steps per pass, each on a random share of the trajectories", ge=1
    )
    packing: bool = setting(True, "pack sequences end to end into rows (no padding)")
    share_prefix: bool = setting(
        True, "with packing: a prompt several sequences of a micro-batch start with is computed once (exact)"
    )
    fused_logprobs: bool = setting(True, "logprobs from hidden states in vocabulary chunks (no full logits)")
    logprob_chunk_tokens: int = setting(2048, "tokens per chunk of the fused logprob computation", ge=1)
    compile: bool = setting(False, "torch.compile the vocabulary math (CUDA only)")
    dtype: Literal["bfloat16", "float16", "float32"] = setting(
        "bfloat16", "autocast dtype on CUDA (float32: none)"
    )
    # Off by default: the engine samples in float32 on CPU, and a bfloat16 trainer scores those
    # samples slightly differently (the importance weights correct for it, the metrics show it).
    cpu_autocast: bool = setting(
        False, "autocast to dtype on CPU too (about 1.7x faster steps on CPUs with AVX512-BF16 or AMX)"
    )
    gradient_checkpointing: bool = setting(False, "recompute activations in backward")
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
    stream: bool = setting(
        True,
        "backpropagate each group as it arrives, the optimizer step once groups_per_step are in (the"
        " same update; one epoch and minibatch, group-relative advantages, no critic or reference model)",
    )
    keep_weights: int = setting(2, "published weight directories kept on disk", ge=1)
    read_block_ms: int = setting(1000, "how long one read of the stream blocks", ge=1)
    weights_dir: str = setting("runs/weights", "where published weights are saved")
    publish_merged: bool = setting(
        False, "a LoRA model's published weights are whole, its adapter merged (else the adapter alone)"
    )
    ckpt_dir: str | None = setting(
        None, "checkpoints; empty: acknowledge each step's groups at once (no resume)"
    )
    keep_checkpoints: int = setting(2, "checkpoints kept on disk", ge=1)
    consumer: str = setting("trainer-0", "fixed per trainer rank: a restart finds its own pending groups")
    manifest: str | None = setting(None, "a file copied into every checkpoint as manifest.json (the run's)")
    rollout_log_dir: str | None = setting(
        None, "the rollout log's directory (trainer.rollout_log): every trajectory read, by step; empty: none"
    )
    rollout_log_keep_steps: int | None = setting(
        None, "steps of the rollout log kept on disk (the oldest files go); empty: all", ge=1
    )
