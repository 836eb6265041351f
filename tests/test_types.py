"""The floor and the environment seams type-check under mypy (config in pyproject.toml's
``[tool.mypy]``), checked where CI runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The floor and the types an environment is written against; grow this list as modules are typed.
CHECKED = [
    "pqrl",
    "env_server/environment.py",
    "env_server/tools.py",
    "env_server/registry.py",
    "env_server/types.py",
    "env_server/client.py",
    "env_server/sessions.py",
    "env_server/wrappers.py",
    "env_server/http_guard.py",
    "env_server/pools.py",
    "agent_loop/tool_parser.py",
    "tasks/suite.py",
    "tasks/check.py",
    "tasks/repo/swebench.py",
    "tasks/coding/diffs.py",
    "tasks/corpus.py",
    "tasks/retrieval.py",
    "tasks/retrieval_server.py",
    "tasks/coding/policy_classes.py",
    "tasks/repo/env.py",
    "tasks/repo/grading.py",
    "tasks/repo/values.py",
    "tasks/coding/reference.py",
    "tasks/coding/assert_methods.py",
    "sandboxes/uids.py",
    "sandboxes/recipes.py",
    "sandboxes/repo_source.py",
    "trainer/losses.py",
    "trainer/objective.py",
    "trainer/screening.py",
    "trainer/batch.py",
    "trainer/step.py",
    "trainer/streaming.py",
    "agent_loop/culling.py",
    "agent_loop/config.py",
    "launcher/errors_cli.py",
    "launcher/quiet.py",
    "launcher/tasks_import.py",
    "trainer/rollout_log.py",
    "trainer/trackers.py",
    "launcher/view_data.py",
    "launcher/view_command.py",
    "launcher/generate_command.py",
    "tasks/repo/generate.py",
    "tasks/repo/project.py",
    "tasks/coding/mutations.py",
    "engine/config.py",
    "engine/backends.py",
    "launcher/engine_choice.py",
]


def mypy(*paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def test_mypy_passes():
    out = mypy(*CHECKED)
    assert "No module named mypy" not in out.stderr, "mypy is not installed: pip install -e '.[dev]'"
    assert out.returncode == 0, f"mypy found errors:\n{out.stdout[-8000:]}{out.stderr[-2000:]}"


def test_mypy_reports_a_wrong_annotation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(x: int) -> str:\n    return x\n")
    out = mypy(str(bad))
    assert out.returncode == 1 and "bad.py:2: error: Incompatible return value type" in out.stdout, out
