"""``pqrl tasks validate --check`` for real: each coding task's worked example (its gold patch
written with the environment's tools, then submit) earns 1 and its empty episode 0, in real
sandboxes; a task whose gold patch is wrong is named with its reason and the exit status is 2;
``submit --check`` refuses such a suite before storing it. No container is left behind."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.coding.diffs import apply_patch, split_patch, unified_diff
from tasks.coding.env import builtin_suite

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tasks" / "coding" / "suite.jsonl"


def _run(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The command's result and the containers its process left (labelled with its pid)."""
    cmd = [sys.executable, "-m", "launcher.cli", "tasks", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=240)
    fmt = '{{.ID}} {{.Label "pqrl.owner"}}'
    listed = subprocess.run(["docker", "ps", "-a", "--format", fmt], capture_output=True, text=True).stdout
    mine = f"{socket.gethostname()}:{proc.pid}:"
    left = [line.split()[0] for line in listed.splitlines() if f" {mine}" in line]
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), left


def _three(tmp_path: Path, gold: dict[int, str] | None = None) -> Path:
    lines = SUITE.read_text().splitlines()[:4]
    for i, patch in (gold or {}).items():
        task = json.loads(lines[i])
        task["gold_patch"] = patch
        lines[i] = json.dumps(task)
    path = tmp_path / "three.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_builtin_gold_patch_lays_out_as_files():
    for task in builtin_suite().tasks:
        assert task.gold_patch
        changed = apply_patch(task.repo, task.gold_patch)
        assert changed and all(changed[p] != task.repo.get(p) for p in changed), task.id
    old = "".join(f"line {i}\n" for i in range(40))
    new = old.replace("line 2\n", "two\n").replace("line 37\n", "")  # two hunks
    patch = unified_diff("a.py", old, new) + unified_diff("b.py", None, "made\n")
    patch += unified_diff("c.py", "gone\n", None) + unified_diff("d.py", "x = 1", "x = 2")  # no final newline
    files = {"a.py": old, "c.py": "gone\n", "d.py": "x = 1"}
    assert apply_patch(files, patch) == {"a.py": new, "b.py": "made\n", "c.py": None, "d.py": "x = 2"}
    with pytest.raises(ValueError, match="does not match line"):
        apply_patch({"a.py": "x = 1\n"}, unified_diff("a.py", "x = 2\n", "x = 3\n"))


def test_check_passes_gold_1_and_empty_0_and_names_a_task_whose_gold_is_wrong(tmp_path):
    good, left = _run("validate", "--check", "--jobs", "3", str(_three(tmp_path)))
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stderr.count("[check ") == 3 and ": FAIL" not in good.stderr, good.stderr
    assert "3 valid coding tasks" in good.stdout and not left, left

    task = json.loads(SUITE.read_text().splitlines()[2])
    path = split_patch(task["gold_patch"])[0].path
    source = task["repo"][path]
    wrong = unified_diff(path, source, source + "\n# no fix here\n")  # applies, fixes nothing
    stale = unified_diff(
        path, "def nothing():\n    pass\n", "def nothing():\n    return 1\n"
    )  # applies nowhere
    suite = _three(tmp_path, {2: wrong, 3: stale})
    lines = suite.read_text().splitlines()
    solved = json.loads(lines[1])  # its bug already fixed: doing nothing passes the hidden tests
    solved["repo"].update(apply_patch(solved["repo"], solved["gold_patch"]))
    fixed = split_patch(solved["gold_patch"])[0].path
    solved["gold_patch"] = unified_diff(fixed, solved["repo"][fixed], solved["repo"][fixed] + "\n# ok\n")
    lines[1] = json.dumps(solved)
    suite.write_text("\n".join(lines) + "\n")
    bad, left = _run("validate", "--check", str(suite))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and not left, bad.stdout + bad.stderr
    failed = [line for line in bad.stdout.splitlines() if line.startswith("FAIL ")]
    ids = [json.loads(line)["id"] for line in lines[1:]]
    assert [f.split(":")[0] for f in failed] == [f"FAIL {i}" for i in ids], bad.stdout
    assert "empty episode: an episode without a call earned 1, not 0" in failed[0], failed
    assert "gold patch" in failed[1], failed  # the grader checks the gold itself
    assert "could not be built" in failed[2] and "does not match" in failed[2], failed
    assert bad.stderr.strip().splitlines()[-1].endswith("3 of 3 task(s) fail --check, listed above")

    refused, left = _run("submit", "--check", str(suite), "--run", "r", "--redis-url", "redis://127.0.0.1:9")
    assert refused.returncode == 2 and "fail --check" in refused.stderr and not left, refused.stderr


def test_check_fails_a_repo_task_a_forged_outcome_could_pass(tmp_path):
    """A FAIL_TO_PASS test with no check the probes record is judged by its outcome alone, which a
    submission's pytest hook can rewrite: --check names it and fails the task; the sample passes."""
    from tasks.repo.sample import sample_task

    sample = sample_task()
    unsafe = {
        **sample,
        "id": "repo-sample-unsafe",
        "fail_to_pass": [*sample["fail_to_pass"], "tests/test_calc.py::test_call"],
    }
    unsafe["test_patch"] = sample["test_patch"].replace("@@ -0,0 +1,5 @@", "@@ -0,0 +1,9 @@") + (
        '+\n+\n+def test_call():\n+    importlib.import_module("calc").add(1, 1)\n'  # passes, checks nothing
    )
    manifest = {"name": "repo-safety", "version": "1", "env_id": "repo-v1", "kind": "repo", "reward": "env",
                "description": "the sample and a variant", "defaults": {}}  # fmt: skip
    suite = tmp_path / "repo.jsonl"
    suite.write_text("\n".join(json.dumps(x) for x in ({"suite": manifest}, sample, unsafe)) + "\n")
    out, left = _run("validate", "--check", "--jobs", "2", str(suite))
    failed = [line for line in out.stdout.splitlines() if line.startswith("FAIL ")]
    assert out.returncode == 2 and not left, out.stdout + out.stderr
    assert len(failed) == 1 and failed[0].startswith("FAIL repo-sample-unsafe"), out.stdout
    assert "cannot judge safely (tests/test_calc.py::test_call)" in failed[0], failed
    assert '"verdict": "junit"' in failed[0] and "earned" not in failed[0], failed  # the way forward


def test_check_names_a_repo_gold_that_does_not_apply_with_gits_error(tmp_path):
    """A gold patch whose context is wrong: --check says so once, with git's own error line, not a
    cut pytest banner and a list of tests judged unsafe because of it."""
    from tasks.repo.sample import sample_task

    sample = sample_task()
    stale = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
    stale += " def add(a, b):\n-    return a - b\n+    return a + b\n"  # calc.py does not exist
    task = {**sample, "id": "repo-sample-stale", "patch": stale}
    typo = {**sample, "id": "repo-sample-typo", "fail_to_pass": ["tests/test_calc.py::test_ad"]}
    manifest = {"name": "repo-stale", "version": "1", "env_id": "repo-v1", "kind": "repo", "reward": "env",
                "description": "a gold that does not apply", "defaults": {}}  # fmt: skip
    suite = tmp_path / "repo.jsonl"
    suite.write_text("\n".join(json.dumps(x) for x in ({"suite": manifest}, task, typo)) + "\n")
    out, left = _run("validate", "--check", str(suite))
    failed = [line for line in out.stdout.splitlines() if line.startswith("FAIL ")]
    assert out.returncode == 2 and not left and len(failed) == 2, out.stdout + out.stderr
    assert "the gold solution: the gold patch does not apply: error: calc.py" in failed[0], failed
    assert "cannot judge safely" not in failed[0] and "test session starts" not in failed[0], failed
    # a mistyped id: not found in its file (missing), not a test the gold fails
    assert "1 listed test(s) not found in their test files" in failed[1] and "test_ad']" in failed[1], failed
    assert "did not pass" not in failed[1], failed
