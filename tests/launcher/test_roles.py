"""One config for every role of a distributed run: where a process finds the services comes from its
flags or ``PQRL_*`` variables, and what it samples must match what the run's other processes use
(the first to join fixes it in Redis; a worker from another config is refused, naming the fields)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import yaml

from launcher.jobconfig import RolloutSection, load_config, shared_settings
from launcher.train_command import _service_overrides, add_train_arguments
from pqrl.store import TrajectoryStore
from pqrl.store.run_pins import differences


def _config(tmp_path: Path, **rollout) -> Path:
    cfg = {"run": "roles", "output_dir": str(tmp_path / "runs"),
           "tasks": {"suites": [{"generate": "calc", "n": 8}]},
           "rollout": {"group_size": 4, "temperature": 0.7, **rollout}}  # fmt: skip
    path = tmp_path / f"job{len(rollout)}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_differences_name_every_leaf_that_differs_or_is_missing():
    run = {"rollout": {"temperature": 0.7, "top_p": 1.0}, "model": "m", "tasks": {"suites": [{"n": 8}]}}
    ours = {
        "rollout": {"temperature": 1.0, "top_p": 1.0},
        "model": "m",
        "extra": 1,
        "tasks": {"suites": [{"n": 9}]},
    }
    assert differences(run, ours) == {
        "extra": (None, 1),
        "rollout.temperature": (0.7, 1.0),
        "tasks.suites": ([{"n": 8}], [{"n": 9}]),
    }
    assert differences(run, run) == {}


def test_shared_settings_leave_out_only_how_a_process_paces_itself(tmp_path):
    cfg = load_config(_config(tmp_path))
    shared = shared_settings(cfg)["rollout"]
    left_out = set(RolloutSection.model_fields) - set(shared)
    assert left_out == {"max_concurrent_groups", "progress_every_s", "put_timeout_s", "lease_timeout_s",
                        "episode_deadline_s", "backend_grace_s"}  # fmt: skip
    assert {"temperature", "top_p", "group_size", "max_new_tokens", "max_staleness"} <= set(shared)
    paced = load_config(_config(tmp_path, max_concurrent_groups=9))
    assert shared_settings(paced) == shared_settings(cfg), "a worker may run more groups at once"


def test_flags_then_environment_say_where_the_services_are(monkeypatch):
    import argparse

    p = argparse.ArgumentParser()
    add_train_arguments(p)
    monkeypatch.setenv("PQRL_REDIS_URL", "redis://env:1/0")
    monkeypatch.setenv("PQRL_ENGINES", "http://e1:3, http://e2:3")
    monkeypatch.delenv("PQRL_ENV_SERVERS", raising=False)
    got = _service_overrides(p.parse_args(["c.yaml"]))
    assert got == {
        "services.redis_url": "redis://env:1/0",
        "services.engines": ["http://e1:3", "http://e2:3"],
    }
    got = _service_overrides(
        p.parse_args(["c.yaml", "--redis-url", "redis://flag:2/0", "--engine", "http://f:1"])
    )
    assert got["services.redis_url"] == "redis://flag:2/0" and got["services.engines"] == ["http://f:1"]


def test_the_first_process_fixes_the_settings_and_a_fresh_trainer_replaces_them(redis_server):
    async def go() -> None:
        async with TrajectoryStore(redis_server.url, "r") as store:
            first = {"rollout": {"temperature": 0.7, "stop_token_ids": (1, 2)}}
            assert await store.pins.agree(first) == {}
            assert await store.pins.agree({"rollout": {"temperature": 0.7, "stop_token_ids": [1, 2]}}) == {}
            other = {"rollout": {"temperature": 1.0, "stop_token_ids": [1, 2]}}
            assert await store.pins.agree(other) == {"rollout.temperature": (0.7, 1.0)}
            assert await store.pins.get() == {"rollout": {"temperature": 0.7, "stop_token_ids": [1, 2]}}
            assert await store.pins.agree(other, replace=True) == {}
            assert await store.pins.agree(first) == {"rollout.temperature": (1.0, 0.7)}

    asyncio.run(go())


def test_a_worker_whose_sampling_differs_from_the_run_refuses_to_start(tmp_path, redis_server):
    run_cfg = load_config(_config(tmp_path))

    async def trainer_joined() -> None:
        async with TrajectoryStore(redis_server.url, "roles") as store:
            assert await store.pins.agree(shared_settings(run_cfg)) == {}

    asyncio.run(trainer_joined())
    hotter = _config(tmp_path, temperature=1.0)
    cmd = [sys.executable, "-m", "launcher.cli", "train", str(hotter), "--role", "rollout", "--quiet",
           "--redis-url", redis_server.url, "--engine", "http://127.0.0.1:9"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "rollout.temperature: the run's 0.7, this config's 1.0" in out.stderr, out.stderr[-2000:]
    fresh = subprocess.run([*cmd, "--fresh"], capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 2 and "--fresh is the trainer's" in fresh.stderr
    no_engine = subprocess.run(cmd[:-2], capture_output=True, text=True, timeout=120)
    assert no_engine.returncode == 2 and "need engines" in no_engine.stderr
