"""The wire types of SGLang's native HTTP API, shared by the client and the built-in server.

Request bodies refuse unknown keys, so a misspelt field is an error rather than a silent default.
Response bodies keep unknown keys (a real SGLang server reports more than pqrl reads). ``Generation``
is what ``generate`` returns to its caller: one finished generation, per-token logprobs and versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.errors import EngineError
from engine.sampling_params import SamplingParams

__all__ = [
    "AbortRequest",
    "ControlResponse",
    "DestroyWeightsUpdateGroupRequest",
    "FinishReason",
    "GenerateRequest",
    "GenerateResponse",
    "Generation",
    "InitWeightsUpdateGroupRequest",
    "MetaInfo",
    "ModelInfo",
    "PauseRequest",
    "SamplingParams",
    "LoRAUpdateResponse",
    "LoadLoRAAdapterRequest",
    "UnloadLoRAAdapterRequest",
    "UpdateWeightsFromDiskRequest",
    "UpdateWeightsFromDistributedRequest",
    "UpdateWeightsResponse",
    "parse_version",
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- generation -----------------------------------------------------------------------------------


class GenerateRequest(_Request):
    """Body of ``POST /generate``: one prompt (``input_ids`` or ``text``) or a batch of them."""

    input_ids: list[int] | list[list[int]] | None = None
    text: str | list[str] | None = None
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = False
    return_text_in_logprobs: bool = False
    logprob_start_len: int = Field(default=-1, description="input-token logprobs are not supported: -1 only")
    stream: bool = False
    rid: str | list[str] | None = None
    lora_path: str | None = Field(
        None, description="SGLang: the loaded LoRA adapter (by name) to generate with"
    )

    @field_validator("sampling_params", mode="before")
    @classmethod
    def _sglang_forms(cls, value: Any) -> Any:
        """SGLang also accepts ``null`` for a default and one string for ``stop``."""
        if not isinstance(value, dict):
            return value
        value = {k: v for k, v in value.items() if v is not None}
        if isinstance(value.get("stop"), str):
            value["stop"] = [value["stop"]]
        return value


class FinishReason(BaseModel):
    """``{"type": "stop", "matched": ...}``, ``{"type": "length", "length": n}`` or
    ``{"type": "abort", "message": ...}``."""

    model_config = ConfigDict(extra="allow")

    type: str
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None


class MetaInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = ""
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    weight_version: str | None = None
    output_token_logprobs: list[list[Any]] | None = None  # [logprob, token_id, text_or_null]
    output_token_weight_versions: list[str] | None = None  # built-in engine only


class GenerateResponse(BaseModel):
    """Body of a non-streaming ``/generate`` answer (a list of them for a batch)."""

    model_config = ConfigDict(extra="allow")

    text: str = ""
    output_ids: list[int]
    meta_info: MetaInfo


@dataclass(frozen=True)
class Generation:
    """A finished generation, possibly stitched from several segments by the abort-resume path.

    Attributes:
        output_ids: generated tokens, exactly as the engine produced them.
        logprobs: engine logprob of each token (log_softmax(logits / T) at the token).
        versions: weight version that produced each token.
        finish_reason: of the last segment; ``length`` counts all segments' tokens.
        text: the segments' texts, concatenated.
        prompt_tokens: length of the original prompt.
        segments: 1 + the number of resumes.
        server: URL of the server that produced the last segment.
    """

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    text: str
    prompt_tokens: int
    segments: int
    server: str


def parse_version(v: str | None) -> int:
    """An engine's weight version string as an int ("default": never set, i.e. the initial weights)."""
    if v is None or v == "default":
        return 0
    try:
        return int(v)
    except ValueError:
        raise EngineError(
            f"weight_version {v!r} is not an integer: start engines with --weight-version 0"
        ) from None


# -- weights and control --------------------------------------------------------------------------


class UpdateWeightsFromDiskRequest(_Request):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True
    # Accepted for SGLang compatibility, no effect in the built-in engine:
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    token_step: int = 0


class InitWeightsUpdateGroupRequest(_Request):
    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(description="this engine's rank in the group (rank 0 is the trainer)")
    world_size: int = Field(ge=2)
    group_name: str = Field(default="weight_update_group", min_length=1)
    backend: str = "nccl"


class UpdateWeightsFromDistributedRequest(_Request):
    names: list[str]
    dtypes: list[str] = Field(description='torch dtype names, e.g. "bfloat16"')
    shapes: list[list[Annotated[int, Field(ge=0)]]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None
    # Accepted for SGLang compatibility, no effect in the built-in engine:
    torch_empty_cache: bool = False


class DestroyWeightsUpdateGroupRequest(_Request):
    group_name: str = "weight_update_group"


class LoadLoRAAdapterRequest(_Request):
    """SGLang's ``/load_lora_adapter`` (a server started with ``--enable-lora``)."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1, description="a PEFT adapter directory the server can read")
    pinned: bool = False


class UnloadLoRAAdapterRequest(_Request):
    lora_name: str = Field(min_length=1)


class LoRAUpdateResponse(BaseModel):
    """SGLang's answer to ``/load_lora_adapter`` and ``/unload_lora_adapter`` (400 on failure)."""

    model_config = ConfigDict(extra="allow")

    success: bool
    error_message: str | None = None


class PauseRequest(_Request):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class AbortRequest(_Request):
    rid: str = ""
    abort_all: bool = False


class ControlResponse(BaseModel):
    """SGLang's answer to a control call; a failed weight update is ``success: false`` with 400."""

    model_config = ConfigDict(extra="allow")

    success: bool
    message: str = ""


class UpdateWeightsResponse(ControlResponse):
    num_paused_requests: int = 0


class ModelInfo(BaseModel):
    """Body of ``GET /model_info``: the part pqrl reads (SGLang reports the served weight version
    there; it has no ``/get_weight_version`` route). The key is required, its value may be null."""

    model_config = ConfigDict(extra="allow")

    weight_version: str | None
