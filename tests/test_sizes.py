"""No Python file in the repository is longer than 500 lines: code, tests, benchmarks, examples and
scripts alike (every ``*.py`` git tracks), so each module stays one concern a reader can hold."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500


def line_counts(root: Path) -> dict[str, int]:
    """Lines of every tracked ``*.py`` file under ``root`` (a git checkout), by path."""
    names = (
        subprocess.run(["git", "ls-files", "-z", "*.py"], cwd=root, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    counts = {}
    for name in filter(None, names):
        path = root / name
        if path.is_file():  # deleted in the working tree but not yet in the index
            counts[name] = len(path.read_bytes().splitlines())
    return counts


def test_no_python_file_is_longer_than_the_limit():
    counts = line_counts(ROOT)
    assert counts, "git ls-files found no Python files"
    long = {name: n for name, n in counts.items() if n > MAX_LINES}
    assert not long, f"{len(long)} files over {MAX_LINES} lines:\n" + "\n".join(
        f"  {name}: {n} lines" for name, n in sorted(long.items(), key=lambda kv: -kv[1])
    )


def test_line_counts_see_a_long_file(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "notes.txt").write_text("x\n" * (MAX_LINES + 1))
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    assert line_counts(tmp_path) == {"long.py": MAX_LINES + 1, "short.py": MAX_LINES}
