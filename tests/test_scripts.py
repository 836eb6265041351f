"""The README's test command treats "no tests collected" (pytest exit 5) as a failure."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_tests_collected_fails_the_test_command():
    env = {**os.environ, "PQRL_SKIP": "apt docker image model"}  # set-up already ran; keep it quick
    out = subprocess.run(
        ["bash", "scripts/test.sh", "-k", "no_such_test_name_anywhere", "tests/test_scripts.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "collected no tests" in out.stderr
