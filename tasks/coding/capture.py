"""What an agent submitted: its changes to a task's source files, and every other change, dropped.

The workspace is compared file by file with the task's repository snapshot, which the grader
holds itself (it is exactly the tree of the base commit made at reset). The agent's ``.git`` is
never consulted: the agent controls it (commits, ``git replace`` refs, rewritten objects, config
such as ``diff.external`` or ``core.fsmonitor``), so "the diff against the base commit" is
computed on the host from file contents. Changes to source files become a unified diff; changes
anywhere else are dropped and listed, and changes to protected paths (tests, conftest.py,
``*.pth``, sitecustomize/usercustomize, pytest/tox/setup/pyproject settings, plugin metadata)
mark the submission as tampered.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from sandboxes.protocol import Sandbox
from tasks.coding.diffs import filter_patch, is_noise, is_protected, source_files, unified_diff
from tasks.suite import CodingTask

__all__ = ["WORKSPACE", "Submission", "capture_workspace", "submission_from_patch"]

WORKSPACE = "/workspace"
MAX_ENTRIES = 20_000
_MAX_SOURCE_READ = 1 << 20

# Runs in the agent's container with python3 -I (no environment, no user site, no cwd on the path).
_LIST_SCRIPT = r"""
import hashlib, json, os, sys
root, limit = sys.argv[1], int(sys.argv[2])
out, truncated = {}, False
for dirpath, dirnames, filenames in os.walk(root):
    if dirpath == root:
        dirnames[:] = [d for d in dirnames if d != ".git"]
    dirnames.sort()
    links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
    for name in sorted(filenames) + links:
        if len(out) >= limit:
            truncated = True
            break
        full = os.path.join(dirpath, name)
        rel = os.path.relpath(full, root).replace(os.sep, "/")
        if os.path.islink(full):
            out[rel] = "link:" + os.readlink(full)
        elif not os.path.isfile(full):
            out[rel] = "special"
        elif os.path.getsize(full) > 64 << 20:
            out[rel] = "big:%d" % os.path.getsize(full)
        else:
            h = hashlib.sha256()
            with open(full, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            out[rel] = h.hexdigest()
print(json.dumps({"files": out, "truncated": truncated}))
"""


@dataclass
class Submission:
    """The graded part of a solution (``patch``, source files only) and what was dropped."""

    patch: str
    dropped: list[str] = field(default_factory=list)
    tampered_paths: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def submission_from_patch(task: CodingTask, patch: str) -> Submission:
    """A submission given as a patch against the task's repository (e.g. its gold patch)."""
    kept, dropped = filter_patch(patch, source_files(task.repo, task.hidden_tests))
    tampered = [p for p in dropped if is_protected(p, task.hidden_tests)]
    return Submission(kept, dropped, tampered)


async def capture_workspace(sandbox: Sandbox, task: CodingTask, base_commit: str | None = None) -> Submission:
    """Compares ``/workspace`` in the agent's sandbox with the task's repository snapshot."""
    listing = await sandbox.exec(
        ["python3", "-I", "-c", _LIST_SCRIPT, WORKSPACE, str(MAX_ENTRIES)], timeout=120
    )
    try:
        found = json.loads(listing.stdout)
        files: dict[str, str] = found["files"]
    except (ValueError, KeyError, TypeError):
        raise RuntimeError(f"cannot list the workspace: {listing.text()[-500:]}") from None
    sources = source_files(task.repo, task.hidden_tests)
    changed_sources, dropped, ignored = [], [], 0
    for path in sorted(set(files) | set(task.repo)):
        pristine = task.repo.get(path)
        if pristine is not None and files.get(path) == _sha(pristine):
            continue
        if path in sources:
            changed_sources.append(path)
        elif is_noise(path):
            ignored += 1
        else:
            dropped.append(path)
    patch = []
    for path in changed_sources:
        try:
            new = (await sandbox.read_file(f"{WORKSPACE}/{path}", max_bytes=_MAX_SOURCE_READ)).decode("utf-8")
        except (FileNotFoundError, IsADirectoryError):
            new = None  # deleted: the tests will say what that is worth
        except (UnicodeDecodeError, ValueError, OSError) as e:
            new = f"# pqrl: the submitted file could not be read as UTF-8 text ({type(e).__name__})\n"
        patch.append(unified_diff(path, task.repo[path], new))
    head = await sandbox.exec(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=WORKSPACE, timeout=30)
    head_sha = head.stdout.decode(errors="replace").strip() or None
    info = {
        "changed_sources": changed_sources,
        "ignored_noise_files": ignored,
        "listing_truncated": bool(found.get("truncated")),
        "base_commit": base_commit,
        "head": head_sha,
        "head_moved": base_commit is not None and head_sha != base_commit,
    }
    tampered = [p for p in dropped if is_protected(p, task.hidden_tests)]
    return Submission("".join(patch), dropped, tampered, info)
