"""The settings of ``pqrl engine serve``, declared once: the command's flags are derived from them.

``EngineConfig`` says how the built-in engine is built (the SGLang backend takes its model, initial
weight version and seed too); ``ServeConfig`` says how it is served. Standard library only (and the
project floor), so building the command line imports neither torch nor a web framework.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Literal

from pqrl.model_cache import DEFAULT_MODEL
from pqrl.settings import Settings, add_arguments, fields_of, from_arguments, setting

__all__ = ["EngineConfig", "ServeConfig", "add_serve_arguments", "serve_configs"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig(Settings):
    """How to build the built-in engine.

    ``device="auto"`` picks CUDA when available; ``dtype="auto"`` is float32 on CPU and bfloat16 on
    CUDA. Logprobs are computed in float32 from the model's logits whatever the dtype.
    """

    model: str = setting(DEFAULT_MODEL, "built-in model name or a model directory")
    device: str = setting("auto", "builtin: cpu, cuda, cuda:1 (auto: cuda if any)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = setting(
        "auto", "builtin: weights' dtype (auto: float32 on CPU, bfloat16 on GPU)"
    )
    matmul_dtype: Literal["weights", "bfloat16"] = setting(
        "weights",
        "builtin: weights: multiply in the weights' dtype; bfloat16: float32 weights multiplied in bfloat16, "
        "as the trainer's CPU autocast (about 2x faster decode on CPUs with AVX512-BF16 or AMX)",
    )
    weight_version: str = setting("0", "initial weight version (an integer string)")
    seed: int = setting(0, "seeds the sampling of requests that bring no sampling_seed")
    max_running_requests: int = setting(64, "builtin: most requests decoded together", ge=1)
    max_prefill_tokens: int = setting(8192, "builtin: most (padded) prompt tokens prefilled at once", ge=1)
    prefix_cache_tokens: int = setting(
        16384,
        "builtin: most tokens whose KV is kept for later prompts with the same start (0: no sharing)",
        ge=0,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeConfig(Settings):
    """How to serve the engine: which backend, where, and who may call it."""

    backend: Literal["builtin", "sglang", "vllm"] = setting(
        "builtin",
        "builtin: this package's engine; sglang / vllm: replace this process with an SGLang / vLLM server",
    )
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(30000, "port to listen on", ge=1, le=65535)
    api_key: str | None = setting(None, "require this bearer key (None: $PQRL_ENGINE_API_KEY if set)")
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = setting(
        "warning", "the HTTP server's log level"
    )
    engine_args: tuple[str, ...] = setting(
        (), "sglang / vllm: more arguments of the server's launcher, e.g. --tp-size=2"
    )
    # the old name of engine_args, still accepted (configs and scripts use it): appended to it
    sglang_args: dataclasses.InitVar[tuple[str, ...] | list[str] | None] = None

    def __post_init__(self, sglang_args: tuple[str, ...] | list[str] | None = None) -> None:
        if sglang_args:
            object.__setattr__(self, "engine_args", (*self.engine_args, *sglang_args))
        super().__post_init__()


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``pqrl engine serve``: one per field of ``EngineConfig`` and ``ServeConfig``
    (``engine_args`` is the repeatable ``--engine-arg``; ``--sglang-arg``, its old name, is the same flag)."""
    add_arguments(parser, EngineConfig)
    add_arguments(parser, ServeConfig, exclude=("engine_args",))
    (extra,) = (f for f in fields_of(ServeConfig) if f.name == "engine_args")
    parser.add_argument(
        "--engine-arg",
        "--sglang-arg",
        dest="engine_args",
        action="append",
        default=[],
        metavar="ARG",
        help=f"{extra.description} (repeatable)",
    )


def serve_configs(args: argparse.Namespace) -> tuple[EngineConfig, ServeConfig]:
    """The settings of parsed ``add_serve_arguments`` flags (defaults for flags not declared)."""
    return from_arguments(EngineConfig, args), from_arguments(ServeConfig, args)
