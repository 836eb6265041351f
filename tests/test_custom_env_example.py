"""examples/custom_env installs as a plug-in with its own task kind (``convert``): pqrl discovers it
through its entry point, validates its suite (and names every problem of a bad one by line and
field), passes ``pqrl env check`` and trains on it, without any change to pqrl."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "custom_env"
PQRL = str(Path(sys.executable).parent / "pqrl")


def test_example_is_short():
    lines = sum(len(p.read_text().splitlines()) for p in [EXAMPLE / "pyproject.toml", *EXAMPLE.rglob("*.py")])
    assert lines < 100, f"the worked example should stay under 100 lines, has {lines}"


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> dict[str, str]:
    """The environment of a process that sees the example pip-installed (into a target directory)."""
    tmp = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(EXAMPLE, tmp / "src")  # pip builds in place; keep the repo clean
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    pip = subprocess.run([*cmd, "--target", str(tmp / "site"), str(source)], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-2000:]
    return {**os.environ, "PYTHONPATH": str(tmp / "site")}


def pqrl(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PQRL, *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_installed_plugin_is_listed_validated_and_checked(plugin):
    assert "convert-v1: factor, submit" in pqrl(plugin, "env", "list").stdout
    check = pqrl(plugin, "env", "check", "convert-v1")
    assert check.returncode == 0, check.stdout + check.stderr
    for rule in ("task model has id and kind", "worked example earns 1", "empty episode earns 0"):
        assert f"pass  {rule}\n" in check.stdout, check.stdout
    valid = pqrl(plugin, "tasks", "validate", str(EXAMPLE / "convert.jsonl"))
    assert valid.returncode == 0, valid.stderr
    assert "8 valid convert tasks for convert-v1" in valid.stdout


def test_bad_plugin_tasks_are_problems_with_line_and_field(plugin, tmp_path):
    manifest = {
        "name": "bad",
        "version": "1",
        "env_id": "convert-v1",
        "kind": "convert",
        "defaults": {"tolerance": 5, "precision": 2},
        "reward": ["env", {"fn": "brevity"}],
    }
    ok = {"id": "c-1", "kind": "convert", "value": 2, "source": "km", "target": "m", "answer": 2000}
    records = [
        {"suite": manifest},
        ok,
        {**ok, "id": "c-2", "source": "parsec"},
        {k: v for k, v in ok.items() if k != "answer"} | {"id": "c-3"},
        {**ok, "id": "c-4", "kind": "calc"},
        {**ok, "id": "c-5", "colour": "red"},
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    out = pqrl(plugin, "tasks", "validate", str(bad))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    for where in (
        "line 1: suite.defaults.tolerance: ",
        "line 1: suite.defaults.precision: Extra inputs",
        "line 1: suite.reward.1: unknown reward function 'brevity'",
        "line 3 (task c-2): source: ",
        "line 4 (task c-3): answer: Field required",
        "line 5 (task c-4): kind: 'calc' in a suite of kind",
        "line 6 (task c-5): colour: Extra inputs",
    ):
        assert where in out.stdout, out.stdout + out.stderr
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(
        json.dumps({"suite": {**manifest, "env_id": "convert-v9", "defaults": {}, "reward": "env"}})
        + "\n"
        + json.dumps({**ok, "source": "parsec"})
        + "\n"
    )
    out = pqrl(plugin, "tasks", "validate", str(unknown))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert (
        "suite.env_id: unknown environment 'convert-v9'" in out.stdout
        and "line 2 (task c-1): source" in out.stdout
    ), out.stdout + out.stderr


@pytest.mark.timeout(900)  # one short job: about 100 s on 2 idle cores
def test_the_example_trains(plugin, tmp_path):
    cfg = {
        "run": "convert", "output_dir": str(tmp_path / "runs"),
        "tasks": {"suites": [{"path": str(EXAMPLE / "convert.jsonl")}], "epochs": 4},
        "rollout": {"group_size": 4, "max_turns": 2, "max_new_tokens": 48, "max_total_tokens": 1024,
                    "max_concurrent_groups": 2, "temperature": 0.7},
        "train": {"steps": 1, "groups_per_step": 1, "lr": 1e-5, "read_timeout_s": 600, "max_extra_reads": 15},
        "checkpoint": {"every": 1},
    }  # fmt: skip
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    out = pqrl(plugin, "train", str(tmp_path / "job.yaml"), "--quiet", timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["steps"] == 1
    run = tmp_path / "runs" / "convert"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "rollout/groups" in r]
    assert [r["step"] for r in trained] == [1] and trained[0].get("rollout/trajectories_used", 0) > 0, trained
    # the suite's reward adds a format term to the environment's score: any valid call earns a share
    assert trained[0]["rollout/reward_mean"] > 0, trained
    assert not (run / "services.json").exists(), "the private services are gone after the job"
