"""A repo-v1 task the base image runs by itself, for ``pqrl env check repo-v1``."""

from __future__ import annotations

from typing import Any

from tasks.repo.task import RepoTask

__all__ = ["sample_task"]


def sample_task() -> dict[str, Any]:
    """A task the base image runs by itself (its empty ``/srv`` as the repository): for ``pqrl env check``."""
    gold = "diff --git a/calc.py b/calc.py\nnew file mode 100644\n--- /dev/null\n+++ b/calc.py\n"
    gold += "@@ -0,0 +1,2 @@\n"
    gold += "+def add(a, b):\n+    return a + b\n"
    # calc is imported inside the assert, so the unfixed repository (no calc.py) fails at that
    # check, where the verdict sees it, rather than before any check (no evidence: tasks/repo/values.py)
    tests = "diff --git a/tests/test_calc.py b/tests/test_calc.py\nnew file mode 100644\n--- /dev/null\n"
    tests += "+++ b/tests/test_calc.py\n@@ -0,0 +1,5 @@\n+import importlib\n+\n+\n"
    tests += '+def test_add():\n+    assert importlib.import_module("calc").add(2, 3) == 5\n'
    task = RepoTask(
        id="repo-sample", instance_id="sample__calc-1", repo="pqrl/sample", base_commit="0000000",
        problem_statement="Add calc.py with add(a, b) returning a + b.", patch=gold, test_patch=tests,
        fail_to_pass=["tests/test_calc.py::test_add"], test_command="python3 -m pytest -p no:cacheprovider",
        image="pqrl-sandbox-base:latest", repo_path="/srv",
    )  # fmt: skip
    return task.model_dump()
