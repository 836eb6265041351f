"""A checkout of another commit beside this tree, for benchmarks that compare against a baseline."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def worktree(commit: str | None) -> Iterator[Path]:
    """A ``git worktree`` of ``commit``, removed afterwards (editing this tree meanwhile changes nothing
    there); this tree itself when ``commit`` is None."""
    if commit is None:
        yield ROOT
        return
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "checkout"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(repo), commit],
                       check=True, capture_output=True)  # fmt: skip
        try:
            yield repo
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(repo)], check=False)
