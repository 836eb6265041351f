"""Writing a suite file from the command line: whole or not at all, the same way for every command
that makes one (import, generate, filter), so a failure never leaves half a suite behind."""

from __future__ import annotations

from pathlib import Path

from pqrl.errors import UsageError
from tasks.suite import Suite

__all__ = ["check_output", "write_suite"]


def check_output(output: str | Path) -> Path:
    """``output`` as a path whose folder exists: checked before any slow work (builds, sampling)."""
    out = Path(output)
    if not out.parent.is_dir():
        raise UsageError(f"-o {output}: the folder {out.parent} does not exist")
    if out.is_dir():
        raise UsageError(f"-o {output} is a folder", fix="give the suite file's path")
    return out


def write_suite(suite: Suite, output: str | Path) -> Path:
    """Writes ``suite`` to ``output`` through a hidden partial file renamed into place."""
    out = check_output(output)
    partial = out.with_name(f".{out.name}.partial")
    try:
        partial.write_text(suite.to_jsonl())
        partial.replace(out)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise UsageError(f"-o {output} cannot be written: {e}") from None
    return out
