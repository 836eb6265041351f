"""Kill and resume: ``pqrl train`` processes killed at several points (and at a random moment) end
with every group trained exactly once, nothing pending in Redis, and the same weights as a run that
was never interrupted. Real processes, a real Redis, a real (tiny) model on disk."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from pqrl.store import TrajectoryStore
from tests.conftest import make_trajectory

GROUPS, PER_STEP = 12, 2
STEPS = GROUPS // PER_STEP


def _groups() -> list[list]:
    out = []
    for g in range(GROUPS):
        out.append(
            [
                make_trajectory(
                    run_id="r", group_id=f"grp{g:02d}", index=i, seed=100 * g + i, reward=float((i + g) % 2)
                )
                for i in range(4)
            ]
        )
    return out


def _config(path: Path, model: Path, redis_url: str, out: Path) -> Path:
    cfg = {
        "run": "r",
        "output_dir": str(out),
        "tensorboard": False,
        # float32 everywhere: these jobs are compared weight for weight (resumed against straight, two
        # ranks against one), and ``auto`` would autocast to bfloat16 on a CPU that multiplies it
        "model": {"name": str(model), "dtype": "float32"},
        "services": {"redis_url": redis_url},
        "tasks": {"suites": [{"generate": "calc", "n": 4}]},
        "rollout": {"max_staleness": 1000},  # versions jump on resume; keep every group trainable
        "train": {"steps": STEPS, "groups_per_step": PER_STEP, "lr": 1e-3, "read_timeout_s": 20},
        "checkpoint": {"every": 2, "keep": 2},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(
    config: Path, *, failpoint: str | None = None, kill_after_s: float | None = None, ranks: int = 1
) -> int:
    """``pqrl train --role trainer``; with ``ranks`` > 1 under torchrun (FSDP2 on gloo)."""
    env = os.environ | {"PQRL_FAILPOINT": failpoint or "", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "launcher.cli", "train", str(config), "--role", "trainer", "--quiet"]
    if ranks > 1:
        torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        cmd = [sys.executable, *torchrun, *cmd[1:]]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if kill_after_s is not None:
        time.sleep(kill_after_s)
        proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=240)
    killed = (137, -9) if ranks == 1 else (1,)  # torchrun answers a dead rank with 1
    if proc.returncode != 0 and not (proc.returncode in killed and (failpoint or kill_after_s)):
        raise AssertionError(f"trainer failed ({proc.returncode}):\n{out[-3000:]}")
    return proc.returncode


async def _fill(url: str) -> None:
    async with TrajectoryStore(url, "r") as store:
        await store.groups.create_consumer_group("trainer")
        for g in _groups():
            await store.groups.put(g)


async def _redis_figures(url: str) -> tuple[int, int, int]:
    async with TrajectoryStore(url, "r") as store:
        return (
            await store.groups.pending("trainer"),
            await store.groups.backlog(),
            (await store.policy.get()).version,
        )


def _final(out: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    ckpt = out / "r" / "checkpoints"
    final = ckpt / (ckpt / "latest").read_text().strip()
    state = json.loads((final / "state.json").read_text())
    return state, load_file(final / "model" / "model.safetensors")


def test_a_trainer_killed_anywhere_trains_every_group_exactly_once(tiny_model_dir, tmp_path):
    from pqrl.redis_server import RedisServer

    # the uninterrupted reference run
    with RedisServer(data_dir=tmp_path / "redis-ref", appendfsync="always") as redis:
        asyncio.run(_fill(redis.url))
        ref_out = tmp_path / "ref"
        assert _train(_config(tmp_path / "ref.yaml", tiny_model_dir, redis.url, ref_out)) == 0
    ref_state, ref_weights = _final(ref_out)
    assert ref_state["step"] == STEPS and len(ref_state["trained_groups"]) == GROUPS

    with RedisServer(data_dir=tmp_path / "redis", appendfsync="always") as redis:
        asyncio.run(_fill(redis.url))
        out = tmp_path / "out"
        config = _config(tmp_path / "job.yaml", tiny_model_dir, redis.url, out)
        versions = []
        # each point kills the process once; steps are 1-based, checkpoints every 2 steps
        for point in ["read:1", "trained:2", "published:3", "checkpointed:4", "trained:5"]:
            assert _train(config, failpoint=point) == 137, f"failpoint {point} was not reached"
            versions.append(asyncio.run(_redis_figures(redis.url))[2])
        _train(config, kill_after_s=random.Random(0).uniform(4.0, 10.0))  # and one at a random moment
        assert _train(config) == 0
        pending, backlog, version = asyncio.run(_redis_figures(redis.url))
    state, weights = _final(out)
    assert state["step"] == STEPS
    assert sorted(state["trained_groups"]) == sorted(f"grp{g:02d}" for g in range(GROUPS)), (
        "every group trained exactly once in the final model's history"
    )
    assert pending == 0 and backlog == 0, "every group acknowledged and trimmed"
    assert versions == sorted(versions) and version > versions[-1], "versions only grow across restarts"
    diff = max(float((weights[k] - ref_weights[k]).abs().max()) for k in ref_weights)
    assert diff < 1e-5, f"resumed weights differ from the uninterrupted run by {diff}"
