"""The tree stays ruff clean, checked where CI runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout[-4000:]
