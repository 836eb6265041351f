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
from tasks.coding.diffs import filter_patch, is_protected, source_files, unified_diff
from tasks.suite import CodingTask

__all__ = ["WORKSPACE", "Submission", "capture_workspace", "submission_from_patch"]

WORKSPACE = "/workspace"
MAX_ENTRIES = 200_000  # entries walked at most; a workspace past it is graded on what was seen
_MAX_SOURCE_READ = 1 << 20
_NAMES_BUDGET = 40_000  # bytes of other paths reported back: the reply stays under the exec output cap

# Runs in the agent's container with python3 -I (no environment, no user site, no cwd on the path).
# The reply is bounded whatever the agent left behind: the task's own paths are hashed by name,
# every other path is only counted, and names are reported shallowest first up to a byte budget.
# The walk is iterative (no recursion limit on deep trees), never follows links (no loops), and an
# entry it cannot read is reported as such, never an error. Byte-code and caches are counted apart
# (the rule of tasks.coding.diffs.is_noise).
_LIST_SCRIPT = r"""
import hashlib, json, os, stat, sys
root, repo, limit, budget = sys.argv[1], set(json.loads(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4])

def digest(full):
    try:
        st = os.lstat(full)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "link:" + os.readlink(full)
    if not stat.S_ISREG(st.st_mode):
        return "special"
    if st.st_size > 64 << 20:
        return "big:%d" % st.st_size
    h = hashlib.sha256()
    try:
        with open(full, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return "unreadable"
    return h.hexdigest()

def noise(rel):
    parts = rel.split("/")
    return rel.endswith(".pyc") or "__pycache__" in parts or ".pytest_cache" in parts

others, noise_count, seen, truncated, stack = [], 0, 0, False, [""]
while stack and not truncated:
    rel_dir = stack.pop()
    try:
        entries = sorted(os.scandir(os.path.join(root, rel_dir)), key=lambda e: e.name)
    except OSError:
        others.append(rel_dir + "/")  # a directory the walk cannot enter
        continue
    for e in entries:
        seen += 1
        if seen > limit:
            truncated = True
            break
        rel = (rel_dir + "/" + e.name) if rel_dir else e.name
        if rel == ".git":
            continue
        if e.is_dir(follow_symlinks=False):
            stack.append(rel)
        elif rel not in repo:
            if noise(rel):
                noise_count += 1
            else:
                others.append(rel)
names, used = [], 0
for rel in sorted(others, key=lambda r: (r.count("/"), r)):
    used += len(json.dumps(rel)) + 2
    if used > budget:
        break
    names.append(rel)
print(json.dumps({"repo": {p: digest(os.path.join(root, p)) for p in repo}, "others": names,
                  "others_total": len(others), "noise": noise_count, "truncated": truncated}))
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
        ["python3", "-I", "-c", _LIST_SCRIPT, WORKSPACE, json.dumps(sorted(task.repo)), str(MAX_ENTRIES),
         str(_NAMES_BUDGET)], timeout=120,
    )  # fmt: skip
    try:
        found = json.loads(listing.stdout)
        hashes: dict[str, str | None] = found["repo"]
        others: list[str] = found["others"]
        other_total, noise = int(found["others_total"]), int(found["noise"])
        truncated = bool(found["truncated"])
    except (ValueError, KeyError, TypeError):
        raise RuntimeError(f"cannot list the workspace: {listing.text()[-500:]}") from None
    sources = source_files(task.repo, task.hidden_tests)
    changed_sources, dropped = [], []
    for path, pristine in sorted(task.repo.items()):
        if hashes.get(path) == _sha(pristine):
            continue
        (changed_sources if path in sources else dropped).append(path)
    dropped = sorted(dropped + others)  # the listing counted byte-code and caches apart
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
        "ignored_noise_files": noise,
        "other_files": other_total,  # dropped_paths lists the shallowest of them
        "listing_truncated": truncated or len(others) < other_total,
        "base_commit": base_commit,
        "head": head_sha,
        "head_moved": base_commit is not None and head_sha != base_commit,
    }
    tampered = [p for p in dropped if is_protected(p, task.hidden_tests)]
    return Submission("".join(patch), dropped, tampered, info)
