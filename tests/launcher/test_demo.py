"""`pqrl demo`, the tour of the data path: real model, private Redis, task queue, stream, consumer group."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_demo_runs_end_to_end():
    pqrl = Path(sys.executable).parent / "pqrl"
    out = subprocess.run(
        [str(pqrl), "demo", "--tasks", "2", "--group-size", "3", "--max-new-tokens", "8"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["groups"] == 2 and summary["trajectories"] == 6
    assert summary["backlog_before_ack"] == 2 and summary["backlog_after_ack"] == 0
    assert 0 < summary["generated_tokens"] <= 6 * 8
    assert 0.0 <= summary["reward_mean"] <= 1.0
    assert out.stdout.count("[rollout ") == 2 and out.stdout.count("[trainer] group") == 2
