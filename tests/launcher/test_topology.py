"""The deployment as separate services, run from compose.yaml's own commands: a Redis that fsyncs
every write, one built-in engine process, one env server process with sandboxes, two rollout
workers and one trainer, all started with the commands and environment ``docker-compose config``
resolves from compose.yaml (service host names mapped to loopback ports, its /config and /runs
mounts to directories here). A short sandboxed job runs to completion and ends with the embedded
mode's guarantees: every group trained at most once and acknowledged, no task left leased, the
policy version only grew and the engine serves the last one, the workers stopped by themselves
once the trainer finished, and no sandbox is left once the env server stops."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from launcher.compose_local import LocalTopology
from pqrl.store import TrajectoryStore

RUN = "topology"
TOKEN = "topology-test-token"
STEPS, PER_STEP = 2, 2


def _job(config_dir: Path) -> None:
    cfg = {
        "run": RUN,
        "tensorboard": False,
        "tasks": {"suites": [{"generate": "data", "n": 16, "format_reward": 0.2}]},
        "rollout": {"group_size": 4, "max_turns": 3, "max_new_tokens": 48, "max_total_tokens": 1024,
                    "temperature": 0.7, "max_concurrent_groups": 1},
        "train": {"steps": STEPS, "groups_per_step": PER_STEP, "lr": 1e-5, "read_timeout_s": 600,
                  "max_extra_reads": 6},
        "checkpoint": {"every": 1},
    }  # fmt: skip
    (config_dir / "topology.yaml").write_text(yaml.safe_dump(cfg))


def _wait(topology: LocalTopology, name: str, timeout_s: float) -> str:
    proc = topology.procs[name]
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(
            f"{name} still running after {timeout_s} s:\n{topology.log(name)[-3000:]}"
        ) from None
    assert proc.returncode == 0, f"{name} exit {proc.returncode}:\n{topology.log(name)[-4000:]}"
    return topology.log(name)


async def _redis_figures(url: str) -> dict:
    from agent_loop.manager import TASK_CONSUMER_GROUP
    from trainer.loop import STREAM_CONSUMER_GROUP

    async with TrajectoryStore(url, RUN) as store:
        return {
            "trainer_pending": await store.groups.pending(STREAM_CONSUMER_GROUP),
            "tasks_pending": (await store.redis.xpending(store.tasks.key, TASK_CONSUMER_GROUP))["pending"],
            "policy": (await store.policy.get()).version,
            "status": await store.status.get(),
            "gate": await store.gate.state(),
        }


async def _sandboxes_left() -> list:
    from sandboxes.docker_api import DockerAPI

    api = DockerAPI()
    try:
        return await api.list({"pqrl.run": RUN})
    finally:
        await api.close()


@pytest.mark.timeout(1500)
def test_the_compose_topology_runs_a_job_as_separate_processes(tmp_path):
    topology = LocalTopology(
        tmp_path, {"PQRL_ENV_TOKEN": TOKEN, "PQRL_CONFIG": "topology.yaml", "PQRL_RUN": RUN}
    )
    assert topology.services["redis"]["command"][-2:] == ["--appendfsync", "always"]
    _job(tmp_path / "config")
    try:
        topology.start("redis")
        for name in ("engine", "env-server"):
            topology.start(name)
        topology.wait_redis()
        topology.wait_healthy("engine")
        topology.wait_healthy("env-server")
        # compose starts the clients once those are healthy; two workers, as with --scale rollout=2
        for name in ("trainer", "rollout-1", "rollout-2"):
            topology.start(name)

        summary = json.loads(_wait(topology, "trainer", 1200).strip().splitlines()[-1])
        assert summary["steps"] == STEPS
        # the workers stop by themselves once the trainer finished
        workers = [
            json.loads(_wait(topology, n, 180).strip().splitlines()[-1]) for n in ("rollout-1", "rollout-2")
        ]
        assert all(w["ended"] == "the trainer finished the run" for w in workers), workers

        run_dir = tmp_path / "runs" / RUN
        state = json.loads((run_dir / "checkpoints" / f"step-{STEPS:06d}" / "state.json").read_text())
        trained = state["trained_groups"]
        assert len(trained) == len(set(trained)) >= STEPS * PER_STEP, "every group trained at most once"
        assert sum(w["groups_written"] for w in workers) >= len(trained), (workers, len(trained))
        assert all(w["failures"].get("failed_infra", 0) == 0 for w in workers), workers

        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "rollout/groups" in r]
        assert sum(r.get("rollout/trajectories_used", 0) for r in steps) > 0, "no step trained"
        versions = [r["policy/version"] for r in steps]
        assert versions == sorted(versions), f"the policy version went back: {versions}"
        assert all(r.get("rollout/failed_infra_frac", 0.0) == 0.0 for r in steps)
        assert all(r["rollout/tool_calls"] > 0 for r in steps), "episodes ran commands in sandboxes"

        figures = asyncio.run(_redis_figures(topology.redis_url))
        assert figures["trainer_pending"] == 0, "every trained group is acknowledged"
        assert figures["tasks_pending"] == 0, "no task is left leased by a worker"
        assert figures["gate"]["running"] == 0, f"every admitted group ended exactly once: {figures['gate']}"
        assert figures["status"]["phase"] == "finished" and figures["policy"] == summary["policy_version"]
        served = httpx.get(topology.url["engine"] + "/get_weight_version", timeout=5).json()
        assert served["weight_version"] == str(summary["policy_version"]), "the engine serves the last policy"
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["config"]["services"]["env_token"] in (None, "***")
        assert TOKEN not in (run_dir / "manifest.json").read_text() + (run_dir / "config.yaml").read_text()
    finally:
        topology.stop_all()
    assert asyncio.run(_sandboxes_left()) == [], "the env server removed its sandboxes when it stopped"
