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
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from pqrl.errors import PermanentFault, UsageError

__all__ = [
    "ARCHIVE_SUFFIXES",
    "apply_problem",
    "git_error",
    "glob_literal",
    "source_digest",
    "stage_repository",
]

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
    if shutil.which("git") is None:
        raise PermanentFault("git not found", fix="install git on the host")
    r = subprocess.run(["git", *args], cwd=cwd, env=full, capture_output=True, text=True)
    if r.returncode != 0:
        raise _GitFailed(last_line(r.stderr or r.stdout) or f"git {args[0]} failed ({r.returncode})")
    return r.stdout.strip()


class _GitFailed(Exception):
    pass


def last_line(text: str) -> str:
    """The last non-empty line of a command's output, stripped; empty when there is none."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def git_error(output: str) -> str:
    """The line of git's output that says what went wrong (its first ``error:``/``fatal:`` line,
    else its last line), at most 300 characters."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error:", "fatal:"))]
    return (errors[0] if errors else lines[-1] if lines else "git gave no reason")[:300]


def glob_literal(path: str) -> str:
    """``path`` as a pattern of ``git apply --exclude`` (wildmatch) that matches only itself."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in path)


def apply_problem(
    source: str | Path, commit: str, patches: Sequence[tuple[str, str, Sequence[str]]]
) -> str | None:
    """Why the patches, each ``(label, text, paths left out)``, do not apply one after another to
    ``commit`` of the git repository ``source`` (None: they do). Runs on a throwaway index: the
    repository's own index, files and objects are left alone (the blobs the patches make go to a
    throwaway object store), so a read-only clone works too."""
    git_dir = _git_dir(Path(source))
    with tempfile.TemporaryDirectory(prefix="pqrl-apply-") as tmp:
        Path(tmp, "objects").mkdir()
        objects = Path(git_dir, _git("--git-dir", git_dir, "rev-parse", "--git-path", "objects")).resolve()
        env = {**os.environ, **_GIT_ENV, "GIT_INDEX_FILE": f"{tmp}/index", "GIT_OBJECT_DIRECTORY":
               f"{tmp}/objects", "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(objects)}  # fmt: skip
        try:
            _git("--git-dir", git_dir, "read-tree", commit, env=env)
        except _GitFailed as e:
            return f"commit {commit} cannot be read in {source}: {e}"
        for label, text, leave_out in patches:
            excludes = [f"--exclude={glob_literal(p)}" for p in leave_out]
            argv = ["git", "--git-dir", git_dir, "apply", "--cached", "--whitespace=nowarn", *excludes]
            r = subprocess.run(argv, input=text.encode(), env=env, capture_output=True)
            if r.returncode != 0:
                why = git_error(r.stderr.decode("utf-8", "replace") or r.stdout.decode("utf-8", "replace"))
                return f"{label} does not apply to {commit[:12]}: {why}"
    return None


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
        if not _has_commits(git_dir):
            raise UsageError(
                f"commit {base_commit} is not in {source}: it has no commits",
                fix="commit first, or pass a plain folder",
            ) from None
        raise UsageError(
            f"commit {base_commit} is not in {source}", fix="fetch it into the mirror or fix base_commit"
        ) from None


def _has_commits(git_dir: str) -> bool:
    try:
        return bool(_git("--git-dir", git_dir, "rev-list", "-n1", "--all"))
    except _GitFailed:  # a broken repository: the plain "not in" message then
        return True


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


def _is_git(name: str) -> bool:
    return name.lower() == ".git"  # git itself refuses the name in any case


def _files(root: Path) -> list[Path]:
    """Every regular file and symlink under ``root`` (no fifo or device: reading one blocks or
    reads the host), none inside a ``.git`` (a history to keep out)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        links = [d for d in dirnames if Path(dirpath, d).is_symlink()]  # copied as links, not walked
        dirnames[:] = [d for d in dirnames if not _is_git(d) and d not in links]
        for n in filenames + links:
            p = Path(dirpath, n)
            if not _is_git(n) and (p.is_symlink() or p.is_file()):
                out.append(p)
    return out


def stage_repository(source: str | Path, base_commit: str | None, dest: Path, label: str) -> None:
    """Writes the source's files into ``dest`` (new) with a fresh one-commit ``.git``."""
    path = Path(source)
    kind = _kind(path, base_commit)
    dest.mkdir(parents=True)
    if kind == "git":
        assert base_commit is not None
        commit = _resolve(path, base_commit)
        _write_tree(_git_dir(path), commit, dest)
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


def _write_tree(git_dir: str, commit: str, dest: Path) -> None:
    """The commit's tree written byte for byte from its blobs: no checkout, so no filter, hook or
    fsmonitor of the source's configuration runs, and its index and work tree stay untouched."""
    try:
        listing = _git("--git-dir", git_dir, "ls-tree", "-r", "-z", "--full-tree", commit)
    except _GitFailed as e:
        raise PermanentFault(f"reading the tree of {commit[:12]} failed: {e}") from None
    entries = []
    for entry in filter(None, listing.split("\0")):
        meta, _, name = entry.partition("\t")
        mode, kind, sha = meta.split()
        parts = Path(name).parts
        if name.startswith("/") or any(p in ("..", ".") or p.lower() == ".git" for p in parts):
            raise UsageError(f"commit {commit[:12]} holds a path git itself refuses: {name!r}")
        entries.append((mode, kind, sha, name))
    blobs = [sha for _, kind, sha, _ in entries if kind == "blob"]
    cmd = ["git", "--git-dir", git_dir, "cat-file", "--batch"]
    r = subprocess.run(cmd, input="\n".join(blobs).encode() + b"\n", capture_output=True,
                       env={**os.environ, **_GIT_ENV})  # fmt: skip
    if r.returncode != 0:
        raise PermanentFault(f"reading the blobs of {commit[:12]} failed: {last_line(r.stderr.decode())}")
    data, at = r.stdout, 0
    for mode, kind, _sha, name in entries:
        target = _inside(dest, name)
        if kind != "blob":  # a submodule: its commit is not here, only its (empty) directory
            target.mkdir(exist_ok=True)
            continue
        header_end = data.index(b"\n", at)
        header = data[at:header_end].split()
        if len(header) != 3 or header[1] != b"blob":
            raise PermanentFault(f"a blob of {commit[:12]} is missing from {git_dir}: {header!r}")
        size = int(header[2])
        body, at = data[header_end + 1 : header_end + 1 + size], header_end + 2 + size
        if mode == "120000":
            target.symlink_to(body.decode("utf-8", "surrogateescape"))
            continue
        # O_EXCL and O_NOFOLLOW: a second entry of one name cannot write through the first
        fd = os.open(
            target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if mode == "100755" else 0o644
        )
        with os.fdopen(fd, "wb") as f:
            f.write(body)


def _inside(dest: Path, name: str) -> Path:
    """``dest/name`` with its folders made, none of them a symlink (a tree may hold a link named
    like a folder of a later entry, to write outside ``dest``)."""
    target, here = dest / name, dest
    for part in Path(name).parts[:-1]:
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            raise UsageError(f"the tree writes {name!r} through a link or a file: refused")
        here.mkdir(exist_ok=True)
    if target.is_symlink() or target.exists():
        raise UsageError(f"the tree holds {name!r} twice: refused")
    return target


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
    for dirpath, dirnames, filenames in os.walk(dest):  # a history shipped in the archive stays out
        for n in [n for n in dirnames + filenames if _is_git(n)]:
            p = Path(dirpath, n)
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        dirnames[:] = [d for d in dirnames if not _is_git(d)]
        for n in filenames:  # fifos and devices the data filter let through: not source
            p = Path(dirpath, n)
            if not _is_git(n) and not p.is_symlink() and not p.is_file():
                p.unlink()


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
