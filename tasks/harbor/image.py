"""The layer that fits a task's image to pqrl's sandbox, built offline and cached by content.

The sandbox's root filesystem is read-only and only ``/tmp`` and ``/workspace`` are writable
(tmpfs), while a Harbor verifier reads ``/tests`` and writes ``/logs``: the layer makes those two
links into ``HARBOR_ROOT`` under ``/tmp``. The image's working directory (say ``/app``) is kept at
``SEED_DIR``, copied into ``/workspace`` at reset, and becomes a link to ``/workspace``, so the
paths a task names still work. The layer also checks for python3, which the sandbox's exec agent
needs, and is labelled, so a fitted image is never fitted twice.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from sandboxes.image import ImageBuildError, build_image_from_dockerfile

__all__ = ["HARBOR_ROOT", "SEED_DIR", "fit_image", "fitted"]

HARBOR_ROOT = "/tmp/.harbor"
SEED_DIR = "/opt/pqrl-harbor/workdir"
_LABEL = "pqrl.harbor.fitted"
_PYTHON_CHECK = "command -v python3"

# a working directory moved aside would break the image: these stay where they are
_SYSTEM_DIRS = {"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/opt", "/proc", "/sbin", "/sys",
                "/tmp", "/usr", "/var", "/home"}  # fmt: skip


def _inspect(tag: str) -> dict[str, Any] | None:
    """The image's id and config, from one ``docker image inspect``; None when it is not there."""
    cmd = ["docker", "image", "inspect", "-f", "{{json .}}", tag]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    info = json.loads(r.stdout)
    return {"id": info.get("Id", ""), **(info.get("Config") or {})}


def _layer(base: str, info: dict[str, Any]) -> str:
    """The Dockerfile fitting ``base`` (whose id and config are ``info``) to the sandbox."""
    workdir = (info.get("WorkingDir") or "").rstrip("/") or "/"
    user = info.get("User") or ""
    q = shlex.quote
    steps = [
        f"rm -rf /tests /logs && ln -s {HARBOR_ROOT}/tests /tests && ln -s {HARBOR_ROOT}/logs /logs",
        f"mkdir -p {SEED_DIR}",
    ]
    if workdir == "/workspace":
        steps.append(f"cp -a /workspace/. {SEED_DIR}/")
    elif workdir not in _SYSTEM_DIRS and not workdir.startswith(("/tmp/", "/workspace/", "/proc/", "/sys/")):
        steps.append(
            f"if [ -d {q(workdir)} ]; then cp -a {q(workdir)}/. {SEED_DIR}/ && rm -rf {q(workdir)}; fi"
        )
        steps.append(f'mkdir -p "$(dirname {q(workdir)})" && ln -s /workspace {q(workdir)}')
    steps.append(f"chmod -R a+rX {SEED_DIR}")
    lines = [
        f"FROM {base}",
        f"LABEL {_LABEL}=1 pqrl.harbor.base={info['id']}",  # a moved tag (say :latest) gets a new layer
        "USER root",
        f"RUN {_PYTHON_CHECK}",  # a step of its own, so its failure is recognised
        "RUN " + " && ".join(steps),
        "WORKDIR /workspace",
    ]
    return "\n".join(lines + ([f"USER {user}"] if user else [])) + "\n"


def fit_image(base: str, *, name: str = "pqrl-harbor", progress: Callable[[str], None] = print) -> str:
    """The tag of ``base`` with the layer (``base`` itself when it has it); built once per base image id."""
    info = _inspect(base)
    if info is None:  # never pulled: a task names only what the operator loaded
        raise ImageBuildError(f"{base} is not in the local Docker engine: build or load it first")
    if (info.get("Labels") or {}).get(_LABEL) == "1":
        return base
    with tempfile.TemporaryDirectory(prefix="pqrl-harbor-") as tmp:
        dockerfile = Path(tmp, "Dockerfile")
        dockerfile.write_text(_layer(base, info))
        try:
            return build_image_from_dockerfile(dockerfile, name=name, progress=progress)
        except ImageBuildError as e:
            if f"-c {_PYTHON_CHECK}" in str(e):
                raise ImageBuildError(
                    f"{base} has no python3, which the sandbox's exec agent needs"
                ) from None
            raise


@cache
def fitted(image: str) -> str:
    """``fit_image`` once per process and image: a hand-written task may name any local image."""
    return fit_image(image, progress=lambda m: None)
