"""A job never waits for what cannot come: a child process that dies ends it at once with its cause;
the first Ctrl-C ends a trainer waiting for groups; a task plan used up ends the job with its counts.
Real ``pqrl train`` processes, a real Redis, a real (tiny) model on disk."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pqrl.redis_server import RedisServer
from pqrl.store import TrajectoryStore
from tests.conftest import make_trajectory


def _write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def _pqrl_train(config: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "launcher.cli", "train", str(config), "--quiet", *extra]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _processes_mentioning(*texts: object) -> list[str]:
    """``pid: command line`` of each process whose command line or working directory (Redis changes
    into its data directory and rewrites its title) holds one of ``texts``."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and proc.name != str(os.getpid()):
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                cwd = os.readlink(proc / "cwd")
            except OSError:
                continue
            if any(str(t) in cmd or cwd.startswith(str(t)) for t in texts):
                found.append(f"{proc.name}: {cmd}")
    return found


def test_an_engine_that_cannot_load_its_model_ends_the_job_at_once_with_the_cause(tmp_path):
    missing = tmp_path / "no-such-model"
    config = _write(tmp_path / "job.yaml", {
        "run": "bogus", "output_dir": str(tmp_path / "runs"), "tensorboard": False,
        "model": {"name": str(missing), "dtype": "float32"},
        "tasks": {"suites": [{"generate": "calc", "n": 2}]}, "train": {"steps": 1, "groups_per_step": 1},
    })  # fmt: skip
    t0 = time.monotonic()
    proc = _pqrl_train(config)
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 3 and took < 60, f"{proc.returncode} after {took:.0f} s:\n{err[-3000:]}"
    lines = [ln for ln in err.splitlines() if ln.startswith("pqrl train:")]
    assert len(lines) == 1, err[-3000:]
    assert "the engine (pid" in lines[0] and "exited with status" in lines[0], lines[0]
    # the engine's own one-line error (status 3: PermanentFault) is the cause quoted
    assert "exited with status 3" in lines[0] and f"unknown model '{missing}'" in lines[0], lines[0]
    assert "not healthy" not in err and "not ready" not in err
    assert _processes_mentioning(str(tmp_path)) == [], "the job's Redis and engine are gone"


def _trainer_config(tmp_path: Path, model: Path, redis_url: str, **train: int) -> Path:
    return _write(tmp_path / "trainer.yaml", {
        "run": "r", "output_dir": str(tmp_path / "out"), "tensorboard": False,
        "model": {"name": str(model), "dtype": "float32"}, "services": {"redis_url": redis_url},
        "tasks": {"suites": [{"generate": "calc", "n": 4}]}, "rollout": {"max_staleness": 1000},
        "train": {"steps": 1, "groups_per_step": 2, "lr": 1e-3, "read_timeout_s": 600, **train},
        "checkpoint": {"every": 1},
    })  # fmt: skip


async def _put_group(url: str, g: int) -> None:
    async with TrajectoryStore(url, "r") as store:
        group = [make_trajectory(run_id="r", group_id=f"grp{g}", index=i, seed=g + i, reward=float(i % 2))
                 for i in range(4)]  # fmt: skip
        await store.groups.put(group)


async def _trainer_waits(url: str) -> bool:
    async with TrajectoryStore(url, "r") as store:
        if not await store.redis.exists(store.groups.key):
            return False
        groups = await store.redis.xinfo_groups(store.groups.key)
        return any(g["pending"] for g in groups)  # it read the first group and waits for the second


async def _pending(url: str) -> int:
    async with TrajectoryStore(url, "r") as store:
        return await store.groups.pending("trainer")


def test_the_first_ctrl_c_ends_a_trainer_waiting_for_groups_and_resume_trains_them(tiny_model_dir, tmp_path):
    with RedisServer(data_dir=tmp_path / "redis", appendfsync="always") as redis:
        config = _trainer_config(tmp_path, tiny_model_dir, redis.url)
        asyncio.run(_put_group(redis.url, 0))  # one group of the two a step needs
        proc = _pqrl_train(config, "--role", "trainer")
        deadline = time.monotonic() + 120
        while not asyncio.run(_trainer_waits(redis.url)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.5)
        time.sleep(1.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
        assert proc.returncode == 0 and took < 10, f"{proc.returncode} after {took:.1f} s:\n{err[-3000:]}"
        assert "stopped while step 1 waited for groups" in err, err[-3000:]
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["steps"] == 0 and summary["updates"] == 0, summary
        assert summary["ended"].startswith("stopped by a signal") and summary["exit_code"] == 0, summary
        assert asyncio.run(_pending(redis.url)) == 1, "the group read is left unacknowledged, not trained"

        asyncio.run(_put_group(redis.url, 1))  # resumed, the trainer trains the first group with it
        proc = _pqrl_train(config, "--role", "trainer")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["steps"] == 1
        assert asyncio.run(_pending(redis.url)) == 0
    state = json.loads((tmp_path / "out" / "r" / "checkpoints" / "step-000001" / "state.json").read_text())
    assert sorted(state["trained_groups"]) == ["grp0", "grp1"]


def test_a_job_whose_task_plan_runs_out_ends_with_the_counts(long_tiny_model, tmp_path):
    """Two tasks, one epoch, five steps of one group: at most two groups can ever come."""
    config = _write(tmp_path / "job.yaml", {
        "run": "short", "output_dir": str(tmp_path / "runs"), "tensorboard": False,
        "model": {"name": str(long_tiny_model), "dtype": "float32"},
        "tasks": {"suites": [{"generate": "calc", "n": 2}], "epochs": 1},
        "rollout": {"group_size": 2, "max_turns": 1, "max_new_tokens": 4, "max_concurrent_groups": 2},
        "train": {"steps": 5, "groups_per_step": 1, "read_timeout_s": 600, "max_extra_reads": 0},
        "services": {"engine_threads": 1},
    })  # fmt: skip
    t0 = time.monotonic()
    proc = _pqrl_train(config)
    out, err = proc.communicate(timeout=300)
    took = time.monotonic() - t0
    assert proc.returncode == 1 and took < 200, f"{proc.returncode} after {took:.0f} s:\n{err[-3000:]}"
    last = err.strip().splitlines()[-1]
    assert last.startswith("pqrl train: the task plan is used up"), err[-3000:]
    assert "groups produced 2" in last and "read by the trainer 2" in last, last
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ended"] in last and summary["steps"] <= 2 and summary["updates"] == summary["steps"]
    assert summary["exit_code"] == 1
    assert _processes_mentioning(tmp_path, long_tiny_model) == [], "the job's Redis and engine are gone"


KILLED = [("engine", "engine serve"), ("Redis server", "redis-server")]


@pytest.mark.parametrize(("victim", "cmdline"), KILLED)
def test_a_child_killed_mid_job_ends_it_at_once_naming_the_child(long_tiny_model, tmp_path, victim, cmdline):
    config = _write(tmp_path / "job.yaml", {
        "run": "long", "output_dir": str(tmp_path / "runs"), "tensorboard": False,
        "model": {"name": str(long_tiny_model), "dtype": "float32"},
        "tasks": {"suites": [{"generate": "calc", "n": 8}]},
        "rollout": {"group_size": 2, "max_turns": 1, "max_new_tokens": 4, "max_concurrent_groups": 2},
        "train": {"steps": 1000, "groups_per_step": 1, "read_timeout_s": 600, "max_extra_reads": 0},
        "checkpoint": {"every": 1},
    })  # fmt: skip
    proc = _pqrl_train(config)
    latest = tmp_path / "runs" / "long" / "checkpoints" / "latest"
    deadline = time.monotonic() + 120
    while not latest.exists():  # training
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.5)
    found = _processes_mentioning(tmp_path, long_tiny_model)
    (pid,) = [int(p.split(":")[0]) for p in found if cmdline in p]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 1 and took < 30, f"{proc.returncode} after {took:.0f} s:\n{err[-3000:]}"
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"pqrl train: the {victim} (pid {pid}) was killed by SIGKILL"), err[-3000:]
    assert _processes_mentioning(tmp_path, long_tiny_model) == [], "the job's other processes are gone"
