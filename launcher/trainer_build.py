"""What every trainer rank builds the same way: the policy (sharded under torchrun), the reference
model for KL, the optimizer and its warm-up schedule, restored from the run's latest checkpoint."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from launcher.jobconfig import TrainConfig, step_config
from launcher.precision import cpu_has_bf16_matmul

__all__ = ["TrainerParts", "build_trainer"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainerParts:
    model: Any
    tokenizer: Any
    ref_model: Any
    critic: Any  # PPO's value head (trainer.critic.ValueHead), or None
    optimizer: Any
    scheduler: Any
    state: Any  # CheckpointState, or None on a fresh start
    step_cfg: Any
    latest: Path | None


def _load_policy(name_or_dir: str, device: Any = "cpu") -> tuple[Any, Any]:
    import torch

    from pqrl.model_cache import load_model, load_tokenizer

    # float32 master weights; bf16 comes from autocast on GPUs
    return load_model(name_or_dir, dtype=torch.float32).to(device), load_tokenizer(name_or_dir)


def build_trainer(cfg: TrainConfig, ctx: Any) -> TrainerParts:
    """The model, optimizer, scheduler and step settings, from the latest checkpoint when there is one."""
    import torch

    from pqrl.errors import UsageError
    from pqrl.heap import fix_mmap_threshold
    from trainer.checkpoint import latest_checkpoint, load_checkpoint
    from trainer.distributed import shard
    from trainer.optim import adamw

    t = cfg.train
    if t.compact_memory:  # before the first step's activations grow a heap they then fragment
        fix_mmap_threshold()
    if cfg.embedded:
        torch.set_num_threads(cfg.services.trainer_threads)
    torch.manual_seed(cfg.seed)
    latest = latest_checkpoint(cfg.run_dir / "checkpoints")
    device = ctx.device if ctx.distributed else ("cuda" if torch.cuda.is_available() else "cpu")
    lora = cfg.model.lora.enabled  # a LoRA checkpoint holds the adapter: the base comes from model.name
    if latest is not None and (latest / "model" / "adapter_config.json").is_file() != lora:
        raise UsageError(
            f"{latest} was written by a run {'without' if lora else 'with'} model.lora",
            fix="resume with the run's own model.lora settings, or start over with --fresh",
        )
    model, tokenizer = _load_policy(str(latest / "model") if latest and not lora else cfg.model.name, device)
    step_cfg = step_config(cfg)
    if device == "cpu" and step_cfg.cpu_autocast and cpu_has_bf16_matmul() is False:
        log.warning("model.dtype bfloat16 on a CPU without AVX512-BF16 or AMX: bfloat16 matmuls (the "
                    "trainer's, and an embedded engine's) are emulated and slower than float32 here; "
                    "set model.dtype: auto (bfloat16 only where the hardware multiplies it)")  # fmt: skip
    if lora:
        model = _with_adapters(model, cfg, ctx, latest)
    model = shard(model, ctx)
    ref_model = (
        (model if lora else _load_policy(cfg.model.name, device)[0].eval().requires_grad_(False))
        if cfg.algorithm.kl_coef
        else None
    )  # a LoRA policy with its adapters off is the reference (trainer.batch.reference_logprobs)
    critic = None
    if cfg.algorithm.advantage == "ppo":
        from trainer.critic import ValueHead, load_critic

        if ctx.distributed:
            raise ValueError(
                "algorithm.advantage ppo: the critic is not sharded yet; run the trainer as one process"
            )
        critic = ValueHead(model.config.hidden_size).to(device)
        if latest is not None and not load_critic(critic, latest):
            log.warning("%s has no critic (it was not a ppo run): the critic starts at zero", latest)
    trained = [p for p in model.parameters() if p.requires_grad]  # a LoRA model's adapters
    params = [*trained, *([] if critic is None else critic.parameters())]
    optimizer = adamw(params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / (t.warmup_steps + 1))
    )
    state = load_checkpoint(latest, optimizer=optimizer, scheduler=scheduler, model=model) if latest else None
    return TrainerParts(model, tokenizer, ref_model, critic, optimizer, scheduler, state, step_cfg, latest)


def _with_adapters(model: Any, cfg: TrainConfig, ctx: Any, latest: Path | None) -> Any:
    """The policy with ``model.lora``'s adapters, restored from the latest checkpoint when there is one."""
    from pqrl.errors import UsageError
    from trainer.lora import apply_lora, load_adapter

    if ctx.distributed:
        raise UsageError("model.lora trains on one trainer process for now", fix="run without torchrun")
    model = apply_lora(model, cfg.model.lora, base=cfg.model.name)
    if latest is not None:
        load_adapter(model, latest / "model")
    return model
