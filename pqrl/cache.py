"""Where pqrl keeps expensive, reproducible artifacts: outside any clone, shared by all of them."""

from __future__ import annotations

import os
from pathlib import Path

from pqrl.envvars import setting

__all__ = ["cache_dir"]


def cache_dir(*parts: str) -> Path:
    """``$PQRL_CACHE`` (default ``~/.cache/pqrl``) joined with ``parts``, created if missing."""
    root = setting("PQRL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pqrl"
    )
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
