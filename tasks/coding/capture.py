"""What an agent submitted: its changes to a task's source files, and every other change, dropped.

The workspace is compared file by file with the task's repository snapshot, which the grader
holds itself (it is exactly the tree of the base commit made at reset). The agent's ``.git`` is
never consulted: the agent controls it (commits, ``git replace`` refs, rewritten objects, config
such as ``diff.external`` or ``core.fsmonitor``), so "the diff against the base commit" is
computed on the host from file contents. Changes to source files become a unified diff; changes
anywhere else are dropped and listed, and changes to protected paths (tests, conftest.py,
``*.pth``, sitecustomize/usercustomize, pytest/tox/setup/pyproject settings, plugin metadata)
mark the submission as tampered.

Whatever the agent left, capture reads a bounded amount: a file that is not graded is never read
past its pristine size, and a source file is taken only as a regular file (through links only
within the workspace) of at most ``MAX_SOURCE_BYTES`` that is UTF-8 text. A source file that is
not (a FIFO, a device, a huge or sparse file, one still growing) makes the workspace
``Ungradable``: it scores 0 with that reason, and nothing of it runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from sandboxes.protocol import Sandbox
from tasks.coding.diffs import filter_patch, is_protected, source_files, unified_diff
from tasks.coding.record import sendable, text
from tasks.suite import CodingTask

__all__ = [
    "MAX_SOURCE_BYTES",
    "WORKSPACE",
    "Submission",
    "Ungradable",
    "capture_workspace",
    "submission_from_patch",
]

WORKSPACE = "/workspace"
MAX_ENTRIES = 200_000  # entries walked at most; a workspace past it is graded on what was seen
MAX_SOURCE_BYTES = 1 << 20  # a source file taken into the diff (the source policy's limit is lower)
_NAMES_BUDGET = 40_000  # bytes of other paths reported back: the reply stays under the exec output cap

# Runs in the agent's container with python3 -I (no environment, no user site, no cwd on the path),
# its arguments as JSON on stdin (no argv length limit). The reply is bounded whatever the agent
# left behind: the task's own paths get a state each, every other path is only counted, and names
# are reported shallowest first up to a byte budget. The walk is iterative (no recursion limit on
# deep trees), never follows links (no loops), and an entry it cannot read is reported as such,
# never an error. Byte-code and caches are counted apart (the rule of tasks.coding.diffs.is_noise).
# Files are opened non-blocking (a FIFO is never waited on) and read up to a bound (a sparse or
# growing file never keeps the read going); only regular files are read at all.
_LIST_SCRIPT = r"""
import hashlib, json, os, stat, sys
args = json.loads(sys.stdin.buffer.read())
root, repo, sources = args["root"], args["repo"], set(args["sources"])
limit, budget, source_limit = args["max_entries"], args["names_budget"], args["source_limit"]
KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
         stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}

def head(path, n):
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        parts = []
        while n > 0:
            chunk = os.read(fd, min(n, 1 << 20))
            if not chunk:
                break
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)

def repo_state(full, size, sha):
    try:
        st = os.lstat(full)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return ["changed", ""]
        data = head(full, size + 1)
    except FileNotFoundError:
        return ["missing", ""]
    except OSError:
        return ["changed", ""]
    same = data is not None and hashlib.sha256(data).hexdigest() == sha
    return ["same" if same else "changed", ""]

def shown(path):  # a name that is not UTF-8 stays sendable
    return os.fsencode(path).decode("utf-8", "backslashreplace")

def source_state(full, sha):
    real = os.path.realpath(full)
    if not real.startswith(root + "/"):
        return ["rejected", "is a link out of the workspace (to %s)" % shown(real)[:200]]
    try:
        st = os.stat(real)
        if not stat.S_ISREG(st.st_mode):
            kind = KINDS.get(stat.S_IFMT(st.st_mode), "a special file")
            return ["rejected", "is %s, not a regular file" % kind]
        if st.st_size > source_limit:
            return ["rejected", "is %d bytes, over the limit of %d bytes" % (st.st_size, source_limit)]
        data = head(real, source_limit + 1)
    except (FileNotFoundError, NotADirectoryError):
        return ["missing", ""]
    except OSError as e:
        return ["rejected", "cannot be read (%s)" % e.strerror]
    if data is None:
        return ["rejected", "is not a regular file"]
    if len(data) > source_limit:
        return ["rejected", "grew past the limit of %d bytes while it was read" % source_limit]
    digest = hashlib.sha256(data).hexdigest()
    return ["same" if digest == sha else "changed", digest]

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
    name = shown(rel)
    used += len(json.dumps(name)) + 2
    if used > budget:
        break
    names.append(name)
states = {}
for p, (size, sha) in repo.items():
    full = os.path.join(root, p)
    states[p] = source_state(full, sha) if p in sources else repo_state(full, size, sha)
print(json.dumps({"repo": states, "others": names, "others_total": len(others), "noise": noise_count,
                  "truncated": truncated}))
"""


@dataclass
class Submission:
    """The graded part of a solution (``patch``, source files only) and what was dropped."""

    patch: str
    dropped: list[str] = field(default_factory=list)
    tampered_paths: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


class Ungradable(Exception):
    """Task source files that cannot be taken as text (path -> why): the submission scores 0 for
    them, ungraded, with ``info`` saying why and what else was captured."""

    def __init__(self, rejected: dict[str, str], submission: Submission) -> None:
        self.rejected, self.submission = rejected, submission
        super().__init__("; ".join(f"source file {p} {why}" for p, why in sorted(rejected.items())))

    @property
    def info(self) -> dict[str, Any]:
        sub = self.submission
        return sendable({
            **sub.info,
            "reason": str(self),
            "rejected_sources": self.rejected,
            "dropped_paths": sub.dropped,
            "tampered": bool(sub.tampered_paths),
            "tamper_reasons": [f"changed protected path {p}" for p in sub.tampered_paths],
        })  # fmt: skip


@dataclass
class _Listing:
    """The listing script's reply: the task paths' states, and the other paths (counted)."""

    states: dict[str, tuple[str, str]]  # path -> (same | changed | missing | rejected, digest or why)
    others: list[str]
    other_total: int
    noise: int
    truncated: bool


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def submission_from_patch(task: CodingTask, patch: str) -> Submission:
    """A submission given as a patch against the task's repository (e.g. its gold patch)."""
    kept, dropped = filter_patch(patch, source_files(task.repo, task.hidden_tests))
    tampered = [p for p in dropped if is_protected(p, task.hidden_tests)]
    return Submission(kept, dropped, tampered)


async def _list(sandbox: Sandbox, task: CodingTask, sources: list[str]) -> _Listing:
    args = {
        "root": WORKSPACE,
        "repo": {p: [len(text.encode()), _sha(text)] for p, text in task.repo.items()},
        "sources": sources,
        "max_entries": MAX_ENTRIES,
        "names_budget": _NAMES_BUDGET,
        "source_limit": MAX_SOURCE_BYTES,
    }
    listing = await sandbox.exec(
        ["python3", "-I", "-c", _LIST_SCRIPT], stdin=json.dumps(args).encode(), timeout=120
    )
    # The reply comes out of the agent's container: every string in it is made sendable and
    # bounded, and only the task's own paths are taken from it.
    try:
        found = json.loads(listing.stdout)
        states = {p: (text(s[0], 20), text(s[1], 300)) for p, s in found["repo"].items() if p in task.repo}
        others = [text(p, 300) for p in found["others"][:_NAMES_BUDGET]]
        return _Listing(
            states, others, int(found["others_total"]), int(found["noise"]), bool(found["truncated"])
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
        raise RuntimeError(f"cannot list the workspace: {text(listing.text()[-500:])}") from None


async def _read_source(sandbox: Sandbox, path: str, digest: str) -> str:
    """The text of a changed source file the listing vouched for. Raises ValueError saying why it
    cannot be taken: nothing of the agent runs between the listing and this read, so that happens
    only if something outlived its command and changed the file."""
    try:
        data = await sandbox.read_file(f"{WORKSPACE}/{path}", max_bytes=MAX_SOURCE_BYTES)
    except ValueError:
        raise ValueError(f"grew past the limit of {MAX_SOURCE_BYTES} bytes while it was read") from None
    except OSError as e:
        raise ValueError(f"cannot be read ({type(e).__name__})") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise ValueError("changed while it was read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text") from None


async def _source_diffs(
    sandbox: Sandbox, task: CodingTask, changed: dict[str, tuple[str, str]]
) -> tuple[str, dict[str, str]]:
    """(the diff of the changed source files, path -> why for those that cannot be taken)."""
    patch, rejected = [], {}
    for path, (state, detail) in sorted(changed.items()):
        if state == "rejected":
            rejected[path] = detail
            continue
        try:
            new = None if state == "missing" else await _read_source(sandbox, path, detail)
        except ValueError as e:
            rejected[path] = str(e)
            continue
        patch.append(unified_diff(path, task.repo[path], new))  # None: deleted, the tests judge it
    return "".join(patch), rejected


async def capture_workspace(sandbox: Sandbox, task: CodingTask, base_commit: str | None = None) -> Submission:
    """Compares ``/workspace`` in the agent's sandbox with the task's repository snapshot.

    Raises:
        Ungradable: a changed source file cannot be taken as text (see the module's docstring).
    """
    sources = source_files(task.repo, task.hidden_tests)
    found = await _list(sandbox, task, sources)
    changed = {p: s for p, s in found.states.items() if s[0] != "same"}
    changed_sources = sorted(p for p in changed if p in sources)
    dropped = sorted([p for p in changed if p not in sources] + found.others)  # noise was counted apart
    patch, rejected = await _source_diffs(sandbox, task, {p: changed[p] for p in changed_sources})
    head = await sandbox.exec(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=WORKSPACE, timeout=30)
    head_sha = text(head.stdout.decode(errors="replace").strip(), 100) or None
    info = {
        "changed_sources": changed_sources,
        "ignored_noise_files": found.noise,
        "other_files": found.other_total,  # dropped_paths lists the shallowest of them
        "listing_truncated": found.truncated or len(found.others) < found.other_total,
        "base_commit": base_commit,
        "head": head_sha,
        "head_moved": base_commit is not None and head_sha != base_commit,
    }
    tampered = [p for p in dropped if is_protected(p, task.hidden_tests)]
    submission = Submission(patch, dropped, tampered, info)
    if rejected:
        raise Ungradable(rejected, submission)
    return submission
