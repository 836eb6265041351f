"""Unified diffs: writing them, splitting them per file, and keeping only a task's source files.

A coding task's *source files* are the Python modules of its repository snapshot that are not
tests or configuration. Only changes to them are graded; every other change is dropped, and a
change to a *protected* path (tests, conftest.py, ``*.pth``, sitecustomize/usercustomize, pytest,
tox, setup.cfg and pyproject settings, packaging metadata that can declare pytest plugins) marks
the submission as tampered. Byte-code and pytest caches are *noise*: ignored, never reported.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "FilePatch",
    "apply_patch",
    "filter_patch",
    "is_noise",
    "is_protected",
    "source_files",
    "split_patch",
    "unified_diff",
]

_PROTECTED_NAMES = {
    "conftest.py",
    "sitecustomize.py",
    "usercustomize.py",
    "pytest.ini",
    ".pytest.ini",
    "tox.ini",
    "setup.cfg",
    "setup.py",
    "pyproject.toml",
}
_TEST_DIRS = {"test", "tests", "testing"}
_TEST_MODULE = re.compile(r"(test_.*|.*_test|pytest_.*)\.py")
_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_UNSUPPORTED = ("rename from", "copy from", "old mode", "new mode", "GIT binary patch", "Binary files")
_MODES_OK = ("new file mode 100644", "deleted file mode 100644")


def is_noise(path: str) -> bool:
    """Byte-code and caches that honest test runs leave behind."""
    parts = path.split("/")
    return path.endswith(".pyc") or "__pycache__" in parts or ".pytest_cache" in parts


def is_protected(path: str, hidden_tests: Iterable[str] = ()) -> bool:
    """Tests, pytest/packaging configuration and interpreter start-up hooks."""
    parts = path.split("/")
    name = parts[-1]
    return (
        path in set(hidden_tests)
        or name in _PROTECTED_NAMES
        or name.endswith((".pth", ".egg-link"))
        or bool(_TEST_MODULE.fullmatch(name))
        or any(p in _TEST_DIRS for p in parts[:-1])
        or any(p.endswith((".dist-info", ".egg-info")) for p in parts)
    )


def source_files(repo: Mapping[str, str], hidden_tests: Iterable[str] = ()) -> list[str]:
    """The repository's Python modules that are neither tests nor configuration, sorted."""
    hidden = set(hidden_tests)
    return sorted(p for p in repo if p.endswith(".py") and not is_protected(p, hidden) and not is_noise(p))


def unified_diff(path: str, old: str | None, new: str | None) -> str:
    """A git-style diff of one file (``None`` for a missing side) that ``git apply`` accepts."""
    if old == new:
        return ""
    a = (old or "").splitlines(keepends=True)
    b = (new or "").splitlines(keepends=True)
    head_a = "/dev/null" if old is None else f"a/{path}"
    head_b = "/dev/null" if new is None else f"b/{path}"
    out = [f"diff --git a/{path} b/{path}\n"]
    if old is None:
        out.append("new file mode 100644\n")
    elif new is None:
        out.append("deleted file mode 100644\n")
    for line in difflib.unified_diff(a, b, head_a, head_b, n=3):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


@dataclass
class FilePatch:
    """The part of a patch that changes one file."""

    old_path: str | None  # None: the file is created
    new_path: str | None  # None: the file is deleted
    header: list[str]  # the lines between "diff --git" and the first hunk ("index", "new file mode"...)
    lines: list[str]
    has_paths: bool = False  # its ---/+++ lines were seen
    git_paths: tuple[str | None, ...] = ()  # the names on its "diff --git" line, if any

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"

    @property
    def text(self) -> str:
        return "".join(self.lines)


def _strip_prefix(raw: str) -> str | None:
    raw = raw.split("\t", 1)[0].strip()
    if raw == "/dev/null":
        return None
    if raw.startswith('"'):
        return "\0quoted"  # git quotes paths with special characters: never a source file
    return raw[2:] if raw[:2] in ("a/", "b/") else raw


def split_patch(text: str) -> list[FilePatch]:
    """The per-file parts of a git-style or plain unified diff.

    Hunk lengths are honoured, so a removed line that reads ``--- x`` inside a hunk is not taken
    for the header of another file.
    """
    lines = text.splitlines(keepends=True)
    patches: list[FilePatch] = []
    cur: FilePatch | None = None
    old_left = new_left = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if cur is not None and (old_left > 0 or new_left > 0) and line[:1] in (" ", "-", "+", "\\"):
            if line[0] in " -":
                old_left -= 1
            if line[0] in " +":
                new_left -= 1
            cur.lines.append(line)
        elif line.startswith("diff --git "):
            old_left = new_left = 0
            parts = line.split()
            names = [_strip_prefix(x) for x in parts[2:4]] if len(parts) == 4 else [None, None]
            cur = FilePatch(names[0], names[1], [], [line], git_paths=tuple(names))
            patches.append(cur)
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old_left = new_left = 0
            if cur is None or cur.has_paths:  # a plain unified diff: the file starts here
                cur = FilePatch(None, None, [], [])
                patches.append(cur)
            cur.old_path, cur.new_path = _strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:])
            cur.has_paths = True
            cur.lines += [line, lines[i + 1]]
            i += 1
        elif cur is not None:
            hunk = _HUNK.match(line)
            if hunk:
                old_left = int(hunk.group(2) if hunk.group(2) is not None else 1)
                new_left = int(hunk.group(4) if hunk.group(4) is not None else 1)
            elif not cur.has_paths:
                cur.header.append(line.rstrip("\n"))
            cur.lines.append(line)
        i += 1
    return patches


def filter_patch(text: str, allowed: Iterable[str]) -> tuple[str, list[str]]:
    """(the parts of ``text`` that change only ``allowed`` paths, the paths of the parts dropped).

    A part is kept when it modifies or deletes an allowed file with plain text hunks; creations,
    renames, copies, mode changes, symlinks and binary patches are dropped.
    """
    allowed = set(allowed)
    kept, dropped = [], []
    for part in split_patch(text):
        paths = {p for p in (part.old_path, part.new_path) if p is not None}
        named = {p for p in part.git_paths if p is not None}
        modes = [h for h in part.header if "mode" in h.split()]
        ok = (
            bool(paths)
            and paths <= allowed
            and named <= paths  # git apply trusts the "diff --git" names: they must agree
            and part.old_path is not None
            and not any(h.startswith(_UNSUPPORTED) for h in part.header)
            and all(h.startswith(_MODES_OK) for h in modes)
        )
        if ok:
            kept.append(part.text)
        else:
            dropped += sorted(paths | named) or [part.path]
    return "".join(kept), sorted(set(dropped))


def apply_patch(files: Mapping[str, str], patch: str) -> dict[str, str | None]:
    """The files ``patch`` changes, as it leaves them (None: deleted). Strict: every context and
    removed line must match at its hunk's line, else ValueError naming the file and hunk."""
    out: dict[str, str | None] = {}
    for fp in split_patch(patch):
        if fp.old_path is not None and fp.old_path not in files and fp.old_path not in out:
            raise ValueError(f"{fp.old_path}: not in the repository")
        before = out.get(fp.old_path, files.get(fp.old_path)) if fp.old_path else ""
        old = (before or "").splitlines(keepends=True)
        new: list[str] = []
        pos, hunks, last = 0, 0, ""
        for line in fp.lines:
            line = " \n" if hunks and line == "\n" else line  # an empty context line, its space trimmed
            head = _HUNK.match(line)
            if head:
                hunks += 1
                start = max(int(head.group(1)) - (0 if head.group(2) == "0" else 1), 0)
                if start < pos or start > len(old):
                    raise ValueError(f"{fp.path}: hunk {hunks} starts outside the file")
                new += old[pos:start]
                pos = start
            elif hunks and line[:1] in (" ", "-"):
                if pos >= len(old) or old[pos].rstrip("\n") != line[1:].rstrip("\n"):
                    raise ValueError(f"{fp.path}: hunk {hunks} does not match line {pos + 1}")
                if line[0] == " ":
                    new.append(old[pos])
                pos += 1
            elif hunks and line[:1] == "+":
                new.append(line[1:] if line.endswith("\n") else line[1:] + "\n")
            elif hunks and line.startswith("\\") and last in ("+", " ") and new:
                new[-1] = new[-1].rstrip("\n")  # "\ No newline at end of file" after a kept line
            last = line[:1]
        new += old[pos:]
        if fp.new_path is None:
            out[fp.old_path or fp.path] = None
        else:
            if fp.old_path and fp.old_path != fp.new_path:
                out[fp.old_path] = None
            out[fp.new_path] = "".join(new)
    return out
