"""A permanent fault stops a real ``pqrl train`` job at once with one line saying what to fix and exit
status 3, before its task plan is spent: a re-run with the fault fixed trains. Real processes: the
job, its Redis and engine, an env server, Docker."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.launcher.test_fail_fast import _pqrl_train, _processes_mentioning, _write
from tests.servers import env_server_process

pytestmark = pytest.mark.timeout(400)

TOKEN = "the-right-token"


def _job(tmp_path: Path, model: Path, suite: dict, **extra: dict) -> dict:
    cfg = {
        "run": "faulty", "output_dir": str(tmp_path / "runs"), "tensorboard": False,
        "model": {"name": str(model), "dtype": "float32"}, "tasks": {"suites": [suite], "epochs": 1},
        "rollout": {"group_size": 2, "max_turns": 1, "max_new_tokens": 4, "max_concurrent_groups": 2},
        "train": {"steps": 1, "groups_per_step": 1, "read_timeout_s": 600, "max_extra_reads": 0},
        "services": {"engine_threads": 1},
    }  # fmt: skip
    for section, fields in extra.items():
        cfg[section] = cfg.get(section, {}) | fields
    return cfg


def _ended(proc, took_max: float, t0: float) -> tuple[str, dict]:
    out, err = proc.communicate(timeout=300)
    took = time.monotonic() - t0
    assert proc.returncode == 3 and took < took_max, f"{proc.returncode} after {took:.0f} s:\n{err[-3000:]}"
    lines = [ln for ln in err.splitlines() if ln.startswith("pqrl train:")]
    assert len(lines) == 1, err[-3000:]
    assert err.strip().splitlines()[-1] == lines[0], "the line is the last word"
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["updates"] == 0 and summary["exit_code"] == 3 and summary["ended"] in lines[0], summary
    return lines[0], summary


def test_a_wrong_env_server_token_exits_3_at_once_and_the_fixed_rerun_trains(long_tiny_model, tmp_path):
    with env_server_process(TOKEN) as server:
        suite = {"generate": "calc", "n": 2}
        services = {"env_servers": [server.url], "engine_threads": 1}
        config = _write(tmp_path / "job.yaml", _job(tmp_path, long_tiny_model, suite,
                                                    services=services | {"env_token": "wrong"}))  # fmt: skip
        t0 = time.monotonic()
        line, _ = _ended(_pqrl_train(config), 60, t0)
        assert "refuses the job" in line and "403 invalid token" in line and server.url in line, line
        assert "(give the job the env server's token)" in line, line
        assert _processes_mentioning(tmp_path, long_tiny_model) == [], "the job's Redis and engine are gone"

        config = _write(tmp_path / "job.yaml", _job(tmp_path, long_tiny_model, suite,
                                                    services=services | {"env_token": TOKEN}))  # fmt: skip
        proc = _pqrl_train(config)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["updates"] == 1 and summary["ended"].startswith("done"), summary
    assert _processes_mentioning(tmp_path, long_tiny_model) == []


def test_an_env_server_without_docker_exits_3_within_the_grace(long_tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")  # the job's private env server inherits it
    config = _write(tmp_path / "job.yaml", _job(tmp_path, long_tiny_model, {"generate": "data", "n": 2},
                                                rollout={"backend_grace_s": 3}))  # fmt: skip
    t0 = time.monotonic()
    line, _ = _ended(_pqrl_train(config), 90, t0)
    assert "is not ready after 3 s (rollout.backend_grace_s)" in line, line
    assert "unix:///nonexistent" in line and "DOCKER_HOST" in line, line
    assert _processes_mentioning(tmp_path, long_tiny_model) == [], "the job's env server is gone too"


def test_a_suite_of_an_unknown_environment_is_refused_before_anything_starts(long_tiny_model, tmp_path):
    """The suite names an environment no one registered: bad input (2), found when the suite is
    read, before Redis, the engine or the env server start. (An env server that does not know an
    environment the job's process knows is a permanent fault, 3: tests/launcher/test_preflight.py.)"""
    from tasks.calc import calc_suite

    text = calc_suite(2, seed=1).to_jsonl().replace('"env_id":"calc-v1"', '"env_id":"nope-v1"')
    (tmp_path / "suite.jsonl").write_text(text)
    config = _write(
        tmp_path / "job.yaml", _job(tmp_path, long_tiny_model, {"path": str(tmp_path / "suite.jsonl")})
    )
    t0 = time.monotonic()
    proc = _pqrl_train(config)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and time.monotonic() - t0 < 30, f"{proc.returncode}:\n{err[-3000:]}"
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err[-3000:]
    assert "unknown environment 'nope-v1'" in err and "suite.env_id" in err, err
    assert _processes_mentioning(tmp_path, long_tiny_model) == []
