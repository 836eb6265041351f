"""Sandbox images built offline: a debootstrap rootfs piped into ``docker import``.

No container registry is reachable on the machines pqrl is developed on, so the base image is
made from Debian packages alone. Images are tagged by a content hash of their recipe, so a rebuild
happens only when the recipe changes; the rootfs tarball is cached too, so an engine whose images
were wiped re-imports it in seconds instead of bootstrapping again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pqrl.cache import cache_dir
from pqrl.envvars import setting

__all__ = [
    "BASE_RECIPE",
    "ImageBuildError",
    "ImageRecipe",
    "build_image",
    "build_image_from_dockerfile",
    "context_digest",
    "image_exists",
    "require_engine",
]

SANDBOX_USER = "agent"
SANDBOX_UID = 1000


class ImageBuildError(RuntimeError):
    """Building or importing a sandbox image failed; the message carries the tool's output."""


@dataclass(frozen=True)
class ImageRecipe:
    """What determines an offline image; its hash is the image tag."""

    name: str = "pqrl-sandbox-base"
    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = ("python3", "python3-pytest", "git", "ca-certificates")
    user: str = SANDBOX_USER
    uid: int = SANDBOX_UID
    workdir: str = "/workspace"
    env: tuple[tuple[str, str], ...] = field(
        default=(("PYTHONDONTWRITEBYTECODE", "1"), ("LANG", "C.UTF-8"), ("HOME", "/home/agent"))
    )
    revision: int = 1  # bump when the post-processing in _finish_rootfs changes

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{self.name}:{self.digest}"


BASE_RECIPE = ImageRecipe()


def require_engine() -> None:
    """Raises unless the Docker CLI is installed and an engine answers it (else every image
    would look missing, and every build fail, for a reason the user cannot see)."""
    _require("docker", "the Docker CLI (Debian package docker.io)")
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        raise ImageBuildError("no Docker engine answers: start dockerd (scripts/setup.sh does)")


def image_exists(tag: str) -> bool:
    r = subprocess.run(["docker", "image", "inspect", tag], capture_output=True)
    return r.returncode == 0


def build_image(
    recipe: ImageRecipe = BASE_RECIPE,
    *,
    mirror: str | None = None,
    force: bool = False,
    progress: Callable[[str], None] = print,
) -> str:
    """Builds (or finds) the image of ``recipe`` and returns its tag; also tags it ``:latest``."""
    require_engine()
    if image_exists(recipe.tag) and not force:
        progress(f"sandbox image {recipe.tag} is present")
        return recipe.tag
    tarball = cache_dir("images") / f"{recipe.name}-{recipe.digest}.tar"
    if not tarball.is_file() or force:
        _bootstrap(recipe, tarball, mirror or setting("PQRL_DEBIAN_MIRROR"), progress)
    progress(f"importing {tarball} as {recipe.tag}")
    changes = [f"USER {recipe.user}", f"WORKDIR {recipe.workdir}", 'CMD ["/bin/bash"]']
    changes += [f"ENV {k}={v}" for k, v in recipe.env]
    cmd = ["docker", "import", *(a for c in changes for a in ("--change", c)), str(tarball), recipe.tag]
    _run(cmd)
    _run(["docker", "tag", recipe.tag, f"{recipe.name}:latest"])
    return recipe.tag


def context_digest(dockerfile: Path, context: Path) -> str:
    """Hash of the Dockerfile and every file of its build context (paths and contents)."""
    h = hashlib.sha256(dockerfile.read_bytes())
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(context)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def build_image_from_dockerfile(
    dockerfile: str | Path,
    *,
    name: str,
    context: str | Path | None = None,
    force: bool = False,
    progress: Callable[[str], None] = print,
) -> str:
    """``docker build`` where a registry (or a local base image) is reachable; tagged by content."""
    _require("docker", "the Docker CLI (Debian package docker.io)")
    dockerfile = Path(dockerfile)
    if not dockerfile.is_file():
        raise ImageBuildError(f"no Dockerfile at {dockerfile}")
    ctx = Path(context) if context else dockerfile.parent
    tag = f"{name}:{context_digest(dockerfile, ctx)}"
    if image_exists(tag) and not force:
        progress(f"sandbox image {tag} is present")
        return tag
    progress(f"docker build {dockerfile} -> {tag}")
    _run(["docker", "build", "-q", "--force-rm", "-t", tag, "-f", str(dockerfile), str(ctx)])
    _run(["docker", "tag", tag, f"{name}:latest"])
    return tag


def _bootstrap(
    recipe: ImageRecipe, tarball: Path, mirror: str | None, progress: Callable[[str], None]
) -> None:
    _require("debootstrap", "Debian package debootstrap")
    if os.geteuid() != 0:
        raise ImageBuildError("debootstrap needs root")
    with tempfile.TemporaryDirectory(prefix="pqrl-rootfs-", dir=tarball.parent) as tmp:
        rootfs = Path(tmp, "rootfs")
        progress(
            f"debootstrap {recipe.suite} ({recipe.variant}, {', '.join(recipe.packages)}); about a minute"
        )
        cmd = ["debootstrap", f"--variant={recipe.variant}", f"--include={','.join(recipe.packages)}"]
        cmd += [recipe.suite, str(rootfs)] + ([mirror] if mirror else [])
        _run(cmd)
        _finish_rootfs(rootfs, recipe)
        partial = tarball.with_suffix(".partial")
        _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."])
        partial.rename(tarball)


def _finish_rootfs(rootfs: Path, recipe: ImageRecipe) -> None:
    """Adds the unprivileged user and the work dir; drops caches the sandbox never needs."""
    home = f"/home/{recipe.user}"
    with open(rootfs / "etc/passwd", "a") as f:
        f.write(f"{recipe.user}:x:{recipe.uid}:{recipe.uid}::{home}:/bin/bash\n")
    with open(rootfs / "etc/group", "a") as f:
        f.write(f"{recipe.user}:x:{recipe.uid}:\n")
    for d in (home, recipe.workdir):
        p = rootfs / d.lstrip("/")
        p.mkdir(parents=True, exist_ok=True)
        os.chown(p, recipe.uid, recipe.uid)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
        shutil.rmtree(rootfs / junk, ignore_errors=True)
        (rootfs / junk).mkdir(parents=True, exist_ok=True)


def _require(tool: str, what: str) -> None:
    if shutil.which(tool) is None:
        raise ImageBuildError(f"{tool} not found: install {what} (scripts/setup.sh does)")


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ImageBuildError(
            f"{' '.join(cmd[:3])} ... failed ({r.returncode}): {(r.stderr or r.stdout)[-2000:]}"
        )
