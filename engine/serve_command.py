"""``pqrl engine serve``: build the built-in engine and serve it, or hand over to SGLang or vLLM.

Importing this module is cheap; torch, transformers, FastAPI and uvicorn load when a command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING

from engine.config import EngineConfig, ServeConfig, serve_configs
from pqrl.envvars import setting

if TYPE_CHECKING:
    from engine.batcher import BatchEngine

__all__ = ["build_engine", "run", "serve"]


def build_engine(config: EngineConfig) -> BatchEngine:
    """Loads the model and tokenizer (a built-in name or a model directory) into a ``BatchEngine``."""
    import torch

    from engine.batcher import BatchEngine
    from pqrl.model_cache import adapter_base, load_model, load_tokenizer, prepare_model

    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = config.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    # a LoRA checkpoint: its base loaded as the base, the adapter merged by the engine itself, so
    # later adapters merge onto the true base weights, not onto this one's (applied twice)
    adapter = adapter_base(config.model)
    model = load_model(adapter or config.model, dtype=getattr(torch, dtype)).to(device)
    if config.matmul_dtype == "bfloat16":
        from engine.matmul import matmul_in_bfloat16

        matmul_in_bfloat16(model)
    engine = BatchEngine(
        model,
        load_tokenizer(config.model),
        weight_version=config.weight_version,
        seed=config.seed,
        max_running=config.max_running_requests,
        max_prefill_tokens=config.max_prefill_tokens,
        prefix_cache_tokens=config.prefix_cache_tokens,
    )
    if adapter is not None:
        engine.load_weights(prepare_model(config.model))
    return engine


def run(engine: EngineConfig, options: ServeConfig) -> int:
    """Serves until stopped; returns an exit status (2: SGLang or vLLM asked for but not installed).

    Without an ``api_key`` the server takes ``$PQRL_ENGINE_API_KEY`` when set.
    """
    from engine.sglang import SGLangNotInstalled, launch_sglang
    from engine.vllm import VLLMNotInstalled, launch_vllm

    options = dataclasses.replace(options, api_key=options.api_key or setting("PQRL_ENGINE_API_KEY"))
    if options.backend == "sglang":
        try:
            launch_sglang(engine, options)
        except SGLangNotInstalled as e:
            print(f"pqrl engine serve: {e}", file=sys.stderr)
            return 2
    if options.backend == "vllm":
        try:
            launch_vllm(engine, options)
        except (VLLMNotInstalled, ValueError) as e:
            print(f"pqrl engine serve: {e}", file=sys.stderr)
            return 2
    from engine.http_app import create_app
    from pqrl.model_cache import prepare_model
    from pqrl.serving import listening_socket, serve

    sock = listening_socket(options.host, options.port)  # a taken port fails now, not after loading
    app = create_app(
        build_engine(engine), api_key=options.api_key, model_path=str(prepare_model(engine.model))
    )
    serve(app, sock, log_level=options.log_level, timeout_keep_alive=30)
    return 0


def serve(args: argparse.Namespace) -> int:
    """``pqrl engine serve`` with flags parsed by ``engine.config.add_serve_arguments`` (flags left
    out take their defaults); blocks while the server runs."""
    return run(*serve_configs(args))
