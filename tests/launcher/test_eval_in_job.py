"""A training job whose held-out evaluation cannot run (its suite's sandboxes need a Docker that is
unreachable) reports no pass rate: the metrics leave it out and count the failures, the log says
why, and the summary holds the reason instead of ``eval_before`` / ``eval_after``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml


@pytest.mark.timeout(900)
def test_an_evaluation_that_never_ran_reports_no_pass_rate(tmp_path):
    cfg = {
        "run": "noeval", "output_dir": str(tmp_path / "runs"),
        "tasks": {"suites": [{"generate": "calc", "level": 1, "n": 4}]},
        "rollout": {"group_size": 2, "max_turns": 1, "max_new_tokens": 16, "max_concurrent_groups": 1},
        "train": {"steps": 1, "groups_per_step": 1, "read_timeout_s": 600, "max_extra_reads": 0},
        "eval": {"k": 2, "suite": {"generate": "data", "n": 2, "seed": 99}},
    }  # fmt: skip
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(cfg))
    nowhere = {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    cmd = [sys.executable, "-m", "launcher.cli", "train", str(config), "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=os.environ | nowhere)
    assert out.returncode == 0, out.stderr[-4000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1 and "eval_before" not in summary and "eval_after" not in summary
    for when in ("before", "after"):
        assert summary[f"eval_{when}_refused"].startswith("no task ran: 2 of 2"), summary
        assert "Docker" in summary[f"eval_{when}_refused"]
    assert "NO pass@1 reported: no task ran" in out.stderr, "said loudly in the job's output"
    rows = [
        json.loads(ln) for ln in (tmp_path / "runs" / "noeval" / "metrics.jsonl").read_text().splitlines()
    ]
    evals = [r for r in rows if "eval/tasks" in r]
    assert [r["step"] for r in evals] == [0, 1]
    for r in evals:
        assert "eval/pass@1" not in r and "eval/pass@k" not in r, "no rate over tasks that never ran"
        assert r["eval/tasks_run"] == 0 and r["eval/failed_infra"] == 6
