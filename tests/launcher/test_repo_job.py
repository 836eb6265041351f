"""A training job on real-repository tasks as a user runs one: a git repository imported as a
SWE-bench style suite (an image built from it), checked with ``pqrl tasks validate --check``, then
``pqrl train`` from examples/repo.yaml with every part real (SmolLM2 in an engine process, a
private Redis and env server, Docker sandboxes of the repository's image). SmolLM2 solves
nothing: what must hold is that the episodes ran in the repository, were graded 0 or 1 by its
hidden tests with the reason recorded, the job ended with its summary and exit 0, and nothing of
it is left running."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.launcher.test_fail_fast import _processes_mentioning
from tests.sandboxes.test_recipes import _git
from tests.servers import stored_groups
from tests.tasks.test_repo_env import F2P, GOLD, HIDDEN, P2P

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]


def _pqrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "launcher.cli", *args]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=dict(os.environ)
    )


@pytest.fixture
def suite(tmp_path: Path) -> Iterator[Path]:
    """A repository (DIR/acme__mathx: mul adds) imported as two tasks; its image removed after."""
    repo = tmp_path / "repos" / "acme__mathx"
    (repo / "mathx").mkdir(parents=True)
    (repo / "tests").mkdir()
    marker = uuid.uuid4().hex  # a fresh image, so the one removed after is this test's
    (repo / "mathx" / "__init__.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n"
    )
    (repo / "tests" / "test_basic.py").write_text(
        "from mathx import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    (repo / "README.md").write_text(f"# mathx {marker}\n")
    _git(repo.parent, "init", "-q", "-b", "main", "acme__mathx")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    issues = ["mathx: mul(3, 4) returns 7 instead of 12", "mathx.mul adds its arguments"]
    instances = [
        {"instance_id": f"acme__mathx-{i}", "repo": "acme/mathx", "base_commit": base,
         "problem_statement": issue, "patch": GOLD, "test_patch": HIDDEN,
         "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P}
        for i, issue in enumerate(issues)
    ]  # fmt: skip
    src = tmp_path / "instances.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in instances))
    out = tmp_path / "repo-suite.jsonl"
    r = _pqrl("tasks", "import", "swebench", str(src), "-o", str(out), "--repos", str(repo.parent))
    assert r.returncode == 0, r.stdout + r.stderr
    image = json.loads(out.read_text().splitlines()[1])["image"]
    yield out
    subprocess.run(["docker", "rmi", "-f", image], capture_output=True)


def _left(run: str, where: Path) -> tuple[list[str], list[str]]:
    """(containers labelled with the run, processes whose command line or folder names ``where``)."""
    ps = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=pqrl.run={run}"], capture_output=True, text=True
    )
    return ps.stdout.split(), _processes_mentioning(where)


def test_a_repo_suite_trains_through_pqrl_train_and_leaves_nothing(suite, tmp_path):
    check = _pqrl("tasks", "validate", "--check", "--jobs", "2", str(suite))
    # the worked example acts on the repository with the tools (write_file, run git apply, submit)
    assert check.returncode == 0 and "all 2 task(s) pass --check" in check.stdout, check.stdout + check.stderr

    cfg = yaml.safe_load((ROOT / "examples" / "repo.yaml").read_text())  # the shipped example, made small
    run = f"repo-{uuid.uuid4().hex[:8]}"
    cfg |= {"run": run, "output_dir": str(tmp_path / "runs")}
    cfg["tasks"]["suites"][0]["path"] = str(suite)
    cfg["rollout"] |= {"group_size": 2, "max_concurrent_groups": 2, "max_turns": 2, "max_new_tokens": 32,
                       "max_total_tokens": 2048, "episode_deadline_s": 240}  # fmt: skip
    # one step of one group: with no signal (nothing solved) it reads one more, then ends unchanged
    cfg["train"] |= {"steps": 1, "groups_per_step": 1, "max_extra_reads": 1, "read_timeout_s": 400}
    cfg["checkpoint"] = {"every": 1}
    config = tmp_path / "repo.yaml"
    config.write_text(yaml.safe_dump(cfg))

    r = _pqrl("train", str(config), "--quiet", timeout=500)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["run"] == run and summary["steps"] == 1 and summary["exit_code"] == 0, summary
    assert summary["ended"].startswith("done"), summary
    out = tmp_path / "runs" / run
    assert (out / "checkpoints" / "latest").read_text() == "step-000001"
    assert _left(run, tmp_path) == ([], []), "the job left containers or processes"

    groups = asyncio.run(stored_groups(out / "redis", run))
    episodes = [t for g in groups for t in g]
    assert len(groups) >= 1 and all(len(g) == 2 for g in groups) and {t.env for t in episodes} == {"repo-v1"}
    for t in episodes:
        assert t.status.value in ("completed", "truncated") and t.num_generated > 0, t.status
        assert t.reward in (0.0, 1.0) and t.reward_info["instance_id"].startswith("acme__mathx-")
        info = t.reward_info
        if t.reward == 0.0:  # the reason, from the hidden tests run on the repository's files
            assert info["reason"] and "tests/test_basic.py" in info["output_tail"], info
            assert info["failed_tests"] or info["missing_tests"], info
    assert _left(run, tmp_path) == ([], []), "reading the trajectories back left its Redis running"
