"""A repository's files at one version, staged as a git repository with no history.

The source is a git repository (a checkout or a bare mirror) at ``base_commit``, a directory, or a
source distribution archive. Whatever it is, the staged copy holds its files and a ``.git`` made
fresh with one parentless commit of exactly those files: no remotes, no reflog, no other refs and
no objects beyond that commit's, so an agent inside the sandbox cannot dig a later commit (the fix)
out of the history.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

from pqrl.errors import PermanentFault, UsageError

__all__ = ["ARCHIVE_SUFFIXES", "source_digest", "stage_repository"]

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")
# Fixed identity and dates: the same files give the same commit hash on every build.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "pqrl",
    "GIT_AUTHOR_EMAIL": "pqrl@localhost",
    "GIT_COMMITTER_NAME": "pqrl",
    "GIT_COMMITTER_EMAIL": "pqrl@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
    # the host's git configuration (hooks, templates, filters, signing) stays out of the build
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
}


def _git(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, **_GIT_ENV, **(env or {})}
    r = subprocess.run(["git", *args], cwd=cwd, env=full, capture_output=True, text=True)
    if r.returncode != 0:
        raise _GitFailed(_last_line(r.stderr or r.stdout) or f"git {args[0]} failed ({r.returncode})")
    return r.stdout.strip()


class _GitFailed(Exception):
    pass


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _kind(source: Path, base_commit: str | None) -> str:
    if not source.exists():
        raise UsageError(f"the recipe's source {source} does not exist")
    if base_commit is not None:
        return "git"
    if source.is_file():
        if not source.name.endswith(ARCHIVE_SUFFIXES):
            raise UsageError(
                f"the recipe's source {source} is a file but not a source archive "
                f"({', '.join(ARCHIVE_SUFFIXES)})"
            )
        return "archive"
    return "directory"


def _git_dir(source: Path) -> str:
    try:
        return _git("-C", str(source), "rev-parse", "--absolute-git-dir")
    except _GitFailed:
        raise UsageError(f"{source} is not a git repository, yet the recipe names a base_commit") from None


def _resolve(source: Path, base_commit: str) -> str:
    """The full hash of ``base_commit`` in ``source``; a one-line UsageError if it is not there."""
    git_dir = _git_dir(source)
    if base_commit.startswith("-") or not base_commit.strip():
        raise UsageError(f"base_commit {base_commit!r} is not a commit")
    try:
        return _git("--git-dir", git_dir, "rev-parse", "--verify", "--quiet", f"{base_commit}^{{commit}}")
    except _GitFailed:
        raise UsageError(
            f"commit {base_commit} is not in {source}", fix="fetch it into the mirror or fix base_commit"
        ) from None


def source_digest(source: str | Path, base_commit: str | None) -> str:
    """What identifies the source's content: the resolved commit, or a hash of its files."""
    path = Path(source)
    kind = _kind(path, base_commit)
    if kind == "git":
        assert base_commit is not None
        return f"git:{_resolve(path, base_commit)}"
    h = hashlib.sha256()
    if kind == "archive":
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return f"archive:{h.hexdigest()}"
    for p in sorted(_files(path)):
        rel = p.relative_to(path)
        h.update(f"{rel}\0{os.lstat(p).st_mode & 0o111:o}\0".encode())
        h.update(os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
        h.update(b"\0")
    return f"directory:{h.hexdigest()}"


def _files(root: Path) -> list[Path]:
    """Every file and symlink under ``root``, none inside a ``.git`` (a history to keep out)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        links = [d for d in dirnames if Path(dirpath, d).is_symlink()]  # copied as links, not walked
        dirnames[:] = [d for d in dirnames if d != ".git" and d not in links]
        out += [Path(dirpath, n) for n in filenames + links if n != ".git"]
    return out


def stage_repository(source: str | Path, base_commit: str | None, dest: Path, label: str) -> None:
    """Writes the source's files into ``dest`` (new) with a fresh one-commit ``.git``."""
    path = Path(source)
    kind = _kind(path, base_commit)
    dest.mkdir(parents=True)
    if kind == "git":
        assert base_commit is not None
        commit = _resolve(path, base_commit)
        git_dir = _git_dir(path)
        # A private index: the source's own index and work tree are never touched.
        index = {"GIT_INDEX_FILE": str(dest.parent / "pqrl-source.index")}
        try:
            _git("--git-dir", git_dir, "read-tree", commit, env=index)
            _git("--git-dir", git_dir, "--work-tree", str(dest), "checkout-index", "-a", "-f", env=index)
        except _GitFailed as e:
            raise PermanentFault(f"checking out {commit[:12]} from {path} failed: {e}") from None
        finally:
            Path(index["GIT_INDEX_FILE"]).unlink(missing_ok=True)
        label = f"{label} at {commit}"
    elif kind == "archive":
        _extract(path, dest)
    else:
        for p in _files(path):
            target = dest / p.relative_to(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            if p.is_symlink():
                target.symlink_to(os.readlink(p))
            else:
                shutil.copy2(p, target)
    _fresh_history(dest, label)


def _extract(archive: Path, dest: Path) -> None:
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                for name in z.namelist():
                    if name.startswith("/") or ".." in Path(name).parts:
                        raise UsageError(f"{archive} holds a path outside itself: {name}")
                z.extractall(dest)
        else:
            with tarfile.open(archive) as t:
                t.extractall(dest, filter="data")  # refuses absolute paths, .. and device files
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as e:
        raise UsageError(f"{archive} cannot be unpacked: {e}") from None
    top = [p for p in dest.iterdir()]
    if len(top) == 1 and top[0].is_dir():  # an sdist's single top directory (name-version/)
        inner = top[0].rename(dest.parent / f"{dest.name}.top")
        dest.rmdir()
        inner.rename(dest)
    for git in [p for p in dest.rglob(".git")]:  # a history shipped inside the archive stays out
        shutil.rmtree(git) if git.is_dir() and not git.is_symlink() else git.unlink()


def _fresh_history(repo: Path, label: str) -> None:
    """One parentless commit of ``repo``'s files; nothing else in ``.git`` that remembers more."""
    try:
        _git("init", "-q", "--template=", "-b", "main", cwd=repo)
        _git("add", "-A", "-f", ".", cwd=repo)
        _git("commit", "-q", "--allow-empty", "--no-verify", "--no-gpg-sign", "-m", label, cwd=repo)
    except _GitFailed as e:
        raise PermanentFault(f"making the repository's history failed: {e}") from None
    git = repo / ".git"
    for name in ("logs", "COMMIT_EDITMSG", "ORIG_HEAD", "FETCH_HEAD", "hooks", "description"):
        p = git / name
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
