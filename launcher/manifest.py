"""What a run was made of, written as ``manifest.json`` into its run directory and every checkpoint:
the code (git revision, and whether the tree had uncommitted changes), the resolved config (secrets
redacted), the digests of its task suites and base model, the Python and package versions and the
machine's devices. A result can then be traced to what produced it, and a resumed run to what it
resumed."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from launcher.jobconfig import TrainConfig

__all__ = ["manifest_gist", "model_digest", "public_config", "run_manifest"]

ROOT = Path(__file__).resolve().parents[1]
_PACKAGES = (
    "pqrl",
    "torch",
    "transformers",
    "safetensors",
    "redis",
    "pydantic",
    "fastapi",
    "httpx",
    "sglang",
)


def public_config(cfg: TrainConfig) -> dict[str, Any]:
    """The resolved config as JSON values, without the env servers' token or a Redis password."""
    from pqrl.store import redacted

    out = cfg.model_dump(mode="json")
    services = out["services"]
    if services.get("env_token"):
        services["env_token"] = "***"
    if services.get("redis_url"):
        services["redis_url"] = redacted(services["redis_url"])
    return out


def _git() -> dict[str, Any] | None:
    """The source tree's revision and dirty flag; None outside a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()  # fmt: skip

    try:
        return {"revision": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "-uno"))}
    except (OSError, subprocess.SubprocessError):
        return None


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def model_digest(name: str) -> dict[str, Any]:
    """sha256 over the model directory's weight files (names and contents), first 16 hex digits."""
    from pqrl.model_cache import prepare_model

    root = prepare_model(name)
    files = sorted(p for p in root.iterdir() if p.suffix in (".safetensors", ".bin", ".json") and p.is_file())
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}:{_file_digest(p)}\n".encode())
    return {"name": name, "path": str(root), "digest": h.hexdigest()[:16]}


def _versions() -> dict[str, str | None]:
    def version(pkg: str) -> str | None:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {p: version(p) for p in _PACKAGES}


def _engine_versions(cfg: TrainConfig) -> dict[str, str | None]:
    """The version of a vLLM engine the job starts (it runs from a venv of its own)."""
    if cfg.services.engine != "vllm":
        return {}
    from engine.vllm import vllm_version

    return {"vllm": vllm_version()}


def _devices() -> dict[str, Any]:
    import torch

    cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"machine": platform.machine(), "system": platform.platform(), "cpus": os.cpu_count(),
            "cuda": cuda, "cuda_version": torch.version.cuda if cuda else None}  # fmt: skip


def run_manifest(cfg: TrainConfig, suites: list[Any], eval_suite: Any = None) -> dict[str, Any]:
    """The manifest of a run of ``cfg`` training on the built ``suites``."""

    def described(s: Any) -> dict[str, Any]:
        return {"id": s.id, "env_id": s.manifest.env_id, "tasks": len(s.tasks), "digest": s.digest}

    return {
        "run": cfg.run,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": _git(),
        "config": public_config(cfg),
        "suites": [described(s) for s in suites],
        "eval_suite": described(eval_suite) if eval_suite is not None else None,
        "base_model": model_digest(cfg.model.name),
        "python": sys.version.split()[0],
        "packages": _versions() | _engine_versions(cfg),
        "devices": _devices(),
    }


def manifest_gist(m: dict[str, Any]) -> str:
    """One line of ``m`` for ``pqrl status``: code, model, suites, key versions, devices."""
    git = m.get("git") or {}
    code = (
        f"{git['revision'][:10]}{' (uncommitted changes)' if git.get('dirty') else ''}" if git else "no git"
    )
    suites = ", ".join(f"{s['id']} ({s['tasks']})" for s in m["suites"])
    pkgs = m["packages"]
    devices = ", ".join(m["devices"]["cuda"]) or f"{m['devices']['cpus']} CPUs"
    return (f"code {code}; model {m['base_model']['name']} {m['base_model']['digest']}; suites {suites}; "
            f"python {m['python']}, torch {pkgs.get('torch')}, transformers {pkgs.get('transformers')}; "
            f"{devices}")  # fmt: skip
