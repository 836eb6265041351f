"""``model.lora``: train low-rank adapters instead of every weight (off while ``rank`` is 0).

Pydantic and the standard library only, like the rest of the job config.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["LoraSection", "check_lora_job", "publishes_merged"]

# the projections of Llama, Qwen, Mistral and SmolLM attention and MLP blocks
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")


class LoraSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    rank: int = Field(
        0,
        ge=0,
        le=1024,
        description="LoRA rank r: > 0 trains adapters W = W0 + (alpha/r) B A on target_modules only (the "
        "base weights stay frozen; checkpoints carry the adapter, in PEFT format; weight syncs: publish); "
        "0 = off, every weight trains",
    )
    alpha: float = Field(16.0, gt=0, le=1e4, description="LoRA alpha: the adapter's scale is alpha / rank")
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TARGETS),
        min_length=1,
        description="names (last part, or a dotted suffix) of the nn.Linear layers that get adapters; "
        "each must match a layer of the model, tied embeddings and lm_head cannot",
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="dropout on the adapters' input; pqrl train needs 0.0 (its step computes the old and "
        "new logprobs with one dropout-free forward, so their ratio stays exact)",
    )

    publish: Literal["auto", "adapter", "merged"] = Field(
        "auto",
        description="what each weight sync sends the engines: adapter (PEFT's files, about 20 MB at rank 16 "
        "on SmolLM2-135M; pqrl's built-in engine merges it into its base), merged (the whole weights, "
        "W0 + (alpha/r) B A, which any engine loads: vLLM, SGLang URLs); auto = merged for "
        "services.engine vllm, else adapter. Checkpoints keep the adapter alone either way",
    )

    @field_validator("target_modules")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        bad = [n for n in names if not _MODULE_NAME.fullmatch(n)]
        if bad:
            raise ValueError(f"not module names: {bad[:3]} (e.g. q_proj or mlp.down_proj)")
        if len(set(names)) != len(names):
            raise ValueError("a module is named twice")
        return names

    @model_validator(mode="after")
    def _off_means_unset(self) -> LoraSection:
        others = sorted(self.model_fields_set - {"rank"})
        if self.rank == 0 and others:  # a config that sets alpha but forgot rank would train in full
            raise ValueError(f"{', '.join(others)} set while rank is 0 (LoRA off): set rank > 0 to use LoRA")
        return self

    @property
    def enabled(self) -> bool:
        return self.rank > 0


def check_lora_job(cfg: Any) -> None:
    """What a training job cannot combine with LoRA (``TrainConfig``'s check; ValueError names it)."""
    lora = cfg.model.lora
    if not lora.enabled:
        return
    if lora.dropout:
        raise ValueError(
            "model.lora.dropout must be 0.0 for pqrl train: the step computes the old and new logprobs "
            "with one dropout-free forward, so their ratio stays exact"
        )
    if cfg.services.engine != "builtin" and lora.publish == "adapter":
        raise ValueError(
            f"model.lora.publish adapter: services.engine {cfg.services.engine} loads whole weights only; "
            "set model.lora.publish: merged (or auto)"
        )
    if cfg.services.weight_sync.method != "disk":
        raise ValueError(
            "model.lora publishes to the engines from disk only: set services.weight_sync.method: disk"
        )


def publishes_merged(cfg: Any) -> bool:
    """Whether the job's weight syncs carry a LoRA model's whole merged weights (see ``publish``)."""
    lora = cfg.model.lora
    if not lora.enabled:
        return False
    return lora.publish == "merged" or (lora.publish == "auto" and cfg.services.engine != "builtin")
