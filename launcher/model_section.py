"""The ``model`` section of a job config (``pqrl train``) and of an SFT config (``pqrl sft``).

Both commands read the same section, so the demonstrations a cold start trains on are rendered
with the template, template kwargs and tool-call format the RL job then parses with.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from launcher.lora_config import LoraSection
from launcher.precision import Dtype
from pqrl.model_cache import DEFAULT_MODEL

__all__ = ["ModelSection"]


class ModelSection(BaseModel):
    """The model and how its conversation is read and written: one section, the same in ``pqrl
    train`` and ``pqrl sft``, so a cold start trains on the calls the RL job will parse."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(
        DEFAULT_MODEL,
        description="built-in model name, a Hugging Face model directory, or a Hub id (org/model) already "
        "in the local Hugging Face cache (nothing is downloaded)",
    )
    tool_parser: str = Field(
        "hermes",
        description="how the model writes tool calls, named as SGLang/vLLM name their parsers: hermes "
        "(also Qwen2.5), qwen3_coder, llama3_json, mistral, pythonic, gemma, or a plug-in's "
        "(entry points pqrl.tool_parsers)",
    )
    chat_template: str | None = Field(
        None,
        description="the chat template: None = the tokenizer's own; a Jinja file; or a built-in: chatml, "
        "gemma, qwen3",
    )
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra template variables for every render (e.g. enable_thinking)"
    )
    template_history: Literal["strict", "as_generated"] = Field(
        "strict",
        description="a template that rewrites earlier turns (thinking stripped): strict = refused; "
        "as_generated = every turn kept as the model generated it, so training sees exactly what it saw",
    )

    dtype: Dtype = Field(
        "auto",
        description="trainer precision (weights and optimizer stay float32): auto = bfloat16 autocast "
        "where the hardware multiplies bfloat16 (a GPU; a CPU with AVX512-BF16 or AMX, about 1.5x faster "
        "steps), float32 elsewhere; bfloat16 = autocast on any CPU (emulated, slower, where the CPU lacks "
        "them); float32 = never. Where a CPU job autocasts, an embedded job's engine multiplies in "
        "bfloat16 as well (--matmul-dtype bfloat16)",
    )
    lora: LoraSection = LoraSection()

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data  # `model: NAME` names the model alone

    @field_validator("tool_parser")
    @classmethod
    def _known_parser(cls, name: str) -> str:
        from agent_loop.tool_parser import UnknownToolParser, get_parser

        try:
            get_parser(name)
        except UnknownToolParser as e:
            raise ValueError(e.line()) from None
        return name

    @field_validator("chat_template")
    @classmethod
    def _known_template(cls, spec: str | None) -> str | None:
        from loss_masking.chat_templates import resolve_template
        from pqrl.errors import UsageError

        try:
            spec is None or resolve_template(spec)
        except UsageError as e:
            raise ValueError(e.line()) from None
        return spec
