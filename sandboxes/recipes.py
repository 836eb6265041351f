"""Images for one version of a repository: the base image, its dependencies and its files.

Built offline. The requirements are resolved and installed on the host (``pip install --target``
for the base image's Python version and platform: wheels only, nothing compiled inside), then a
Dockerfile FROM the local base image adds them to its site-packages and the repository, with a
one-commit history (sandboxes/repo_source.py), at ``/repo``. The sandbox's ``/workspace`` is a
tmpfs, so a task copies ``/repo`` there at reset (``cp -a /repo/. /workspace``). The image tag is
a hash of the recipe's content (base image id, source commit or digest, requirements, install
step), so every task of one repository version shares one image, built once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pqrl.cache import cache_dir
from pqrl.errors import PermanentFault, UsageError
from sandboxes.image import image_exists, require_engine
from sandboxes.repo_source import last_line, source_digest, stage_repository

__all__ = ["REPO_PATH", "WORKSPACE", "RepoRecipe", "build_recipe", "normal_name", "recipe_tag"]

REPO_PATH = "/repo"  # the repository in the image (read-only: the root filesystem is)
WORKSPACE = "/workspace"  # the sandbox's writable copy, which an editable install points at
INSTALL_STEPS = ("none", "editable")
_REVISION = 5  # bump when the image layout below changes
_NAME = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True)
class RepoRecipe:
    """One repository version's image.

    source: a git repository or bare mirror (with ``base_commit``), a directory, or a source
    archive (an sdist). requirements: pip specs installed for the image's Python. install:
    ``"editable"`` puts the project's source on the image Python's path, from ``/workspace``
    (where the agent edits it; ``src/`` layouts too) and else from ``/repo``, or ``"none"``.
    """

    name: str
    source: str
    base_commit: str | None = None
    requirements: tuple[str, ...] = ()
    install: str = "none"
    base_image: str = "pqrl-sandbox-base:latest"

    def __post_init__(self) -> None:
        for name in ("name", "source", "base_image"):
            if not isinstance(getattr(self, name), str):
                raise UsageError(f"recipe field {name} must be a string")
        if self.base_commit is not None and not isinstance(self.base_commit, str):
            raise UsageError("recipe field base_commit must be a string (a commit hash)")
        if not isinstance(self.requirements, list | tuple):
            raise UsageError("requirements must be a list of pip specs")
        object.__setattr__(self, "requirements", tuple(self.requirements))
        if self.install not in INSTALL_STEPS:
            raise UsageError(f"install must be one of {INSTALL_STEPS}, not {self.install!r}")
        if not _NAME.sub("", self.name.lower()):
            raise UsageError(f"recipe name {self.name!r} has no letter or digit")
        for req in self.requirements:
            if not isinstance(req, str) or not req.strip() or req.lstrip().startswith("-"):
                raise UsageError(f"requirement {req!r} is not a pip spec (options are not accepted)")

    @classmethod
    def from_json(cls, path: str | Path) -> RepoRecipe:
        """A recipe from a JSON object with these fields; a relative source is from the file's folder."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise UsageError(f"recipe {path} cannot be read: {e}") from None
        if not isinstance(data, dict):
            raise UsageError(f"recipe {path} is not a JSON object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown or "name" not in data or "source" not in data:
            raise UsageError(f"recipe {path}: needs name and source; unknown fields {sorted(unknown)}")
        if isinstance(data["source"], str):
            data["source"] = str(Path(path).parent / data["source"])
        return cls(**data)


def build_recipe(recipe: RepoRecipe, *, progress: Callable[[str], None] = print, force: bool = False) -> str:
    """Builds (or finds) ``recipe``'s image and returns its tag."""
    t0 = time.monotonic()

    def say(message: str) -> None:
        progress(f"[recipe {recipe.name} {time.monotonic() - t0:5.1f}s] {message}")

    base = _base_image(recipe.base_image)
    tag, key = _tag_and_key(recipe, base)
    with _build_lock(tag):  # two builds of one recipe at once: the second finds the first's image
        if image_exists(tag) and not force:
            say(f"image {tag} is present")
            return tag
        try:
            _build(recipe, base, tag, key, say)
        except OSError as e:  # a full disk, a file the source cannot give: one line, not a trace
            raise PermanentFault(f"building {tag} failed: {type(e).__name__}: {e}") from None
    say(f"built {tag}")
    return tag


def _build(
    recipe: RepoRecipe, base: dict[str, Any], tag: str, key: dict[str, Any], say: Callable[[str], None]
) -> None:
    with tempfile.TemporaryDirectory(prefix="pqrl-recipe-", dir=cache_dir("recipes")) as tmp:
        stage = Path(tmp)
        say(f"staging the repository ({key['source']})")
        stage_repository(recipe.source, recipe.base_commit, stage / "repo", f"{recipe.name}")
        site, scripts = stage / "site", stage / "bin"
        site.mkdir()
        scripts.mkdir()
        if recipe.requirements:
            say(f"installing {len(recipe.requirements)} requirement(s) on the host for {base['tags']}")
            _install_requirements(recipe.requirements, site, base)
            _move_scripts(site, scripts, base["executable"])
        if recipe.install == "editable":
            (site / "pqrl-project.pth").write_text(_editable_paths(stage / "repo"))
            _dist_info(stage / "repo", site)
        (stage / "gitconfig").write_text("[safe]\n\tdirectory = *\n")  # /repo belongs to root
        (stage / "Dockerfile").write_text(_dockerfile(base, tag))
        _readable(stage)
        say(f"docker build -> {tag}")
        _docker_build(stage, tag)


def recipe_tag(recipe: RepoRecipe) -> str:
    """The tag ``build_recipe`` gives ``recipe`` (resolves the commit; builds nothing)."""
    return _tag_and_key(recipe, _base_image(recipe.base_image))[0]


# ---------------------------------------------------------------- internals


def _tag_and_key(recipe: RepoRecipe, base: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    key = {
        "revision": _REVISION,
        "base": base["id"],
        "source": source_digest(recipe.source, recipe.base_commit),
        "requirements": sorted({r.strip() for r in recipe.requirements}),  # pip's order is not
        "install": recipe.install,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return f"pqrl-repo-{_NAME.sub('-', recipe.name.lower()).strip('-')[:64]}:{digest}", key


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True)


def _base_image(ref: str) -> dict[str, Any]:
    """The base image's id, user, work dir and Python (version, platform, site-packages)."""
    require_engine()
    r = _docker("image", "inspect", ref, "--format", "{{json .}}")
    if r.returncode != 0:
        raise UsageError(f"base image {ref} is not present", fix="pqrl sandbox build-image builds it")
    info = json.loads(r.stdout)
    image_id, config = info["Id"], info.get("Config") or {}
    cached = cache_dir("recipes") / f"python-{image_id.removeprefix('sha256:')[:16]}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    probe = (
        "import json, platform, site, sys\n"
        "print(json.dumps({'version': '%d.%d' % sys.version_info[:2], 'executable': sys.executable,"
        " 'site': site.getsitepackages()[0], 'libc': platform.libc_ver()[1],"
        " 'machine': platform.machine()}))"
    )
    r = _docker("run", "--rm", "--network", "none", "--entrypoint", "python3", ref, "-c", probe)
    if r.returncode != 0:
        raise UsageError(f"base image {ref} has no working python3: {_last_line(r.stderr)}")
    try:
        py = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise UsageError(
            f"base image {ref}: its python3 did not report itself: {r.stdout[-200:]!r}"
        ) from None
    base = {"id": image_id, "ref": ref, "user": config.get("User") or "root",
            "workdir": config.get("WorkingDir") or "/", **py}  # fmt: skip
    base["tags"] = f"cp{py['version'].replace('.', '')} {_platforms(py)[0]}"
    cached.write_text(json.dumps(base))
    return base


def _platforms(py: dict[str, Any]) -> list[str]:
    """The wheel platform tags the base image's Python accepts (manylinux up to its glibc)."""
    machine = py["machine"]
    tags = []
    if py.get("libc"):
        major, minor = (int(x) for x in py["libc"].split(".")[:2])
        tags += [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 16, -1)]
        tags += [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}"]
    return tags + [f"linux_{machine}"]


def _install_requirements(requirements: tuple[str, ...], site: Path, base: dict[str, Any]) -> None:
    version = base["version"]
    cmd = [sys.executable, "-m", "pip", "install", "--target", str(site), "--only-binary=:all:",
           "--python-version", version, "--implementation", "cp",
           "--abi", f"cp{version.replace('.', '')}", "--disable-pip-version-check", "--no-input",
           "--no-warn-script-location", "--progress-bar", "off"]  # fmt: skip
    for platform in _platforms(base):
        cmd += ["--platform", platform]
    r = subprocess.run([*cmd, "--", *requirements], capture_output=True, text=True)
    if r.returncode == 0:
        return
    text = r.stderr or r.stdout
    unresolved = re.search(r"No matching distribution found for (.+)", text)
    if unresolved or "ResolutionImpossible" in text or "Could not find a version" in text:
        what = unresolved.group(1).strip() if unresolved else _last_line(text)
        raise UsageError(
            f"requirement {what} has no wheel for Python {base['tags']}",
            fix="fix the spec or pick a version that ships wheels",
        )
    raise PermanentFault(f"installing the requirements on the host failed: {_last_line(text)}")


def _move_scripts(site: Path, scripts: Path, executable: str) -> None:
    """Console scripts go to /usr/local/bin, their shebang the image's Python, not the host's."""
    made = site / "bin"
    if not made.is_dir():
        return
    for script in made.iterdir():
        data = script.read_bytes()
        if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
            data = b"#!" + executable.encode() + b"\n" + data.split(b"\n", 1)[1]
        (scripts / script.name).write_bytes(data)
        (scripts / script.name).chmod(0o755)
    shutil.rmtree(made)


def _editable_paths(repo: Path) -> str:
    """The .pth lines: the project's import root in the agent's copy first, the image's second."""
    sub = "/src" if (repo / "src").is_dir() and not (repo / "src" / "__init__.py").exists() else ""
    return f"{WORKSPACE}{sub}\n{REPO_PATH}{sub}\n"


def _dist_info(repo: Path, site: Path) -> None:
    """The project's metadata, so ``importlib.metadata.version(project)`` answers as after
    ``pip install -e .``: an sdist's PKG-INFO, else pyproject.toml's static name and version."""
    pkg_info = repo / "PKG-INFO"
    if pkg_info.is_file():
        text = pkg_info.read_text(errors="replace")
        fields = dict(re.findall(r"^(Name|Version): *(.+?) *$", text, re.M))
    else:
        try:
            project = tomllib.loads((repo / "pyproject.toml").read_text()).get("project", {})
        except (OSError, ValueError):
            return
        fields = {"Name": project.get("name"), "Version": project.get("version")}
        text = f"Metadata-Version: 2.1\nName: {fields['Name']}\nVersion: {fields['Version']}\n"
    name, version = fields.get("Name"), fields.get("Version")
    if not isinstance(name, str) or not isinstance(version, str) or not name or not version:
        return  # a dynamic version: nothing to say without running the project's build backend
    key = normal_name(name).replace("-", "_")  # as wheels name their .dist-info
    _uninstall(site, key)
    info = site / f"{key}-{re.sub(r'[^A-Za-z0-9.+!]', '_', version)}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(text)
    (info / "INSTALLER").write_text("pqrl\n")
    (info / "RECORD").write_text("")
    url = {"url": f"file://{WORKSPACE}", "dir_info": {"editable": True}}
    (info / "direct_url.json").write_text(json.dumps(url))


def normal_name(name: str) -> str:
    """A distribution's name as PEP 503 compares them: runs of ``-_.`` as one ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _uninstall(site: Path, key: str) -> None:
    """Removes a released copy of the project a requirement pulled in (as ``pip install -e .``
    replaces it): site-packages comes before the .pth paths and would shadow the agent's copy."""
    for info in site.glob("*.dist-info"):
        if normal_name(info.name.removesuffix(".dist-info").rsplit("-", 1)[0]).replace("-", "_") != key:
            continue
        record = info / "RECORD"
        lines = record.read_text().splitlines() if record.is_file() else []
        for line in lines:
            path = (site / line.split(",")[0]).resolve()
            if path.is_relative_to(site.resolve()) and path.is_file():
                path.unlink()
                for parent in path.parents:  # an empty folder left would be a namespace package
                    if parent == site.resolve() or any(parent.iterdir()):
                        break
                    parent.rmdir()
        shutil.rmtree(info, ignore_errors=True)


def _dockerfile(base: dict[str, Any], tag: str) -> str:
    return "\n".join([
        f"FROM {base['id']}",  # the very image hashed into the tag, even if its name moved since
        "USER root",
        f"COPY site/ {base['site']}/",
        "COPY bin/ /usr/local/bin/",
        f"COPY repo/ {REPO_PATH}/",
        "COPY gitconfig /etc/gitconfig",
        f"USER {base['user']}",
        f"WORKDIR {base['workdir']}",
        f"LABEL pqrl.recipe={json.dumps(tag)}",
        "",
    ])  # fmt: skip


def _readable(root: Path) -> None:
    """Everything world-readable (directories searchable), nothing writable but by root."""
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            if not p.is_symlink():
                mode = p.stat().st_mode  # no setuid, setgid or sticky bit from an archive either
                p.chmod((mode | 0o444 | (0o111 if p.is_dir() or mode & 0o100 else 0)) & 0o755)


def _docker_build(stage: Path, tag: str) -> None:
    r = _docker("build", "-q", "--force-rm", "-t", tag, str(stage))
    if r.returncode != 0:
        raise PermanentFault(f"docker build of {tag} failed: {_last_line(r.stderr or r.stdout)}")


def _last_line(text: str) -> str:
    return last_line(text)[:500] or "(no output)"


@contextlib.contextmanager
def _build_lock(tag: str) -> Iterator[None]:
    path = cache_dir("recipes") / f"{tag.replace(':', '-')}.lock"
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
