"""``pqrl engine serve --backend sglang``: this process becomes a real SGLang server.

Standard library only; SGLang itself is only looked for when launching.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from engine.config import EngineConfig, ServeConfig

__all__ = ["SGLangNotInstalled", "launch_sglang", "sglang_command"]


class SGLangNotInstalled(RuntimeError):
    """``--backend sglang`` on a machine without SGLang."""


def sglang_command(
    *,
    model_path: str,
    host: str,
    port: int,
    weight_version: str = "0",
    api_key: str | None = None,
    seed: int | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``python -m sglang.launch_server`` command line pqrl needs (``--weight-version``: every
    response then reports an integer version string, as the client expects)."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path]
    cmd += ["--host", host, "--port", str(port), "--weight-version", weight_version]
    if api_key:
        cmd += ["--api-key", api_key]
    if seed is not None:
        cmd += ["--random-seed", str(seed)]
    return cmd + list(extra_args)


def launch_sglang(engine: EngineConfig, serve: ServeConfig) -> NoReturn:
    """Replaces this process with a real SGLang server for ``engine.model`` (its signals and exit
    status are SGLang's); the built-in engine's own settings (device, dtype, batch limits) do not apply.

    Raises:
        SGLangNotInstalled: ``sglang`` is not importable here.
    """
    if importlib.util.find_spec("sglang") is None:
        raise SGLangNotInstalled(
            "SGLang is not installed. On a GPU machine: pip install 'pqrl[sglang]'; "
            "anywhere else use the built-in engine (pqrl engine serve --backend builtin)."
        )
    from pqrl.model_cache import prepare_model

    cmd = sglang_command(
        model_path=str(prepare_model(engine.model)),
        host=serve.host,
        port=serve.port,
        weight_version=engine.weight_version,
        api_key=serve.api_key,
        seed=engine.seed,
        extra_args=serve.engine_args,
    )
    os.execv(cmd[0], cmd)
