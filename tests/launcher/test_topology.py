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
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from pqrl.redis_server import free_port, stop_process
from pqrl.store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[2]
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
    config_dir.mkdir()
    (config_dir / "topology.yaml").write_text(yaml.safe_dump(cfg))


def _compose_services() -> dict:
    """compose.yaml as docker-compose resolves it (anchors merged, variables interpolated)."""
    exe = shutil.which("docker-compose")
    cmd = [exe] if exe else ["docker", "compose"]
    env = os.environ | {"PQRL_ENV_TOKEN": TOKEN, "PQRL_CONFIG": "topology.yaml", "PQRL_RUN": RUN}
    out = subprocess.run([*cmd, "-f", "compose.yaml", "config"], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return yaml.safe_load(out.stdout)["services"]


class _Local:
    """Maps compose's service addresses and mounts onto this machine."""

    def __init__(self, tmp: Path) -> None:
        self.ports = {"redis": free_port(), "engine": free_port(), "env-server": free_port()}
        self.tmp = tmp
        self.swaps = {
            "redis://redis:6379": f"redis://127.0.0.1:{self.ports['redis']}",
            "http://engine:30000": f"http://127.0.0.1:{self.ports['engine']}",
            "http://env-server:8100": f"http://127.0.0.1:{self.ports['env-server']}",
            "0.0.0.0": "127.0.0.1",
            "/config/": f"{tmp}/config/",
            "=/runs": f"={tmp}/runs",
        }

    def text(self, value: str) -> str:
        for a, b in self.swaps.items():
            value = value.replace(a, b)
        return value

    def command(self, name: str, svc: dict) -> list[str]:
        cmd = [self.text(str(w)) for w in svc["command"]]
        if "--port" in cmd:
            cmd[cmd.index("--port") + 1] = str(self.ports[name])
        assert cmd[0] == "pqrl", cmd
        return [sys.executable, "-m", "launcher.cli", *cmd[1:]]

    def env(self, svc: dict) -> dict[str, str]:
        given = svc.get("environment") or {}
        return os.environ | {k: self.text(str(v)) for k, v in given.items()} | {"OMP_NUM_THREADS": "1"}


def _start(name: str, cmd: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen:
    out = open(logs / f"{name}.log", "wb")  # noqa: SIM115  (the child keeps writing after this returns)
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{url} exited:\n{log.read_text()[-3000:]}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} not healthy after {timeout_s} s:\n{log.read_text()[-3000:]}")


def _wait(proc: subprocess.Popen, log: Path, timeout_s: float) -> str:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running after {timeout_s} s:\n{log.read_text()[-3000:]}") from None
    text = log.read_text()
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{text[-4000:]}"
    return text


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
    services = _compose_services()
    assert services["redis"]["command"][-2:] == ["--appendfsync", "always"]
    local = _Local(tmp_path)
    _job(tmp_path / "config")
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: dict[str, subprocess.Popen] = {}
    try:
        redis_cmd = [str(w) for w in services["redis"]["command"]]
        here = [
            "--port",
            str(local.ports["redis"]),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(tmp_path),
            "--save",
            "",
        ]
        procs["redis"] = _start("redis", [*redis_cmd, *here], os.environ, logs)
        for name in ("engine", "env-server"):
            procs[name] = _start(name, local.command(name, services[name]), local.env(services[name]), logs)
        redis_url = local.swaps["redis://redis:6379"] + "/0"
        _wait_healthy(local.swaps["http://engine:30000"] + "/health", procs["engine"], logs / "engine.log")
        _wait_healthy(
            local.swaps["http://env-server:8100"] + "/healthz", procs["env-server"], logs / "env-server.log"
        )
        # compose starts the clients once those are healthy; two workers, as with --scale rollout=2
        for name in ("trainer", "rollout-1", "rollout-2"):
            svc = services[name.split("-")[0]]
            procs[name] = _start(name, local.command(name, svc), local.env(svc), logs)

        trainer_out = _wait(procs["trainer"], logs / "trainer.log", timeout_s=1200)
        summary = json.loads(trainer_out.strip().splitlines()[-1])
        assert summary["steps"] == STEPS
        worker_summaries = []
        for name in ("rollout-1", "rollout-2"):  # they stop by themselves once the trainer finished
            out = _wait(procs[name], logs / f"{name}.log", timeout_s=180)
            worker_summaries.append(json.loads(out.strip().splitlines()[-1]))
        assert "the trainer finished the run" in (logs / "rollout-1.log").read_text()

        run_dir = tmp_path / "runs" / RUN
        state = json.loads((run_dir / "checkpoints" / f"step-{STEPS:06d}" / "state.json").read_text())
        trained = state["trained_groups"]
        assert len(trained) == len(set(trained)) >= STEPS * PER_STEP, "every group trained at most once"
        written = sum(s["groups_written"] for s in worker_summaries)
        assert written >= len(trained), (worker_summaries, len(trained))
        assert all(s["failures"].get("infra", 0) == 0 for s in worker_summaries), worker_summaries

        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "rollout/groups" in r]
        assert sum(r.get("rollout/trajectories_used", 0) for r in steps) > 0, "no step trained"
        versions = [r["policy/version"] for r in steps]
        assert versions == sorted(versions), f"the policy version went back: {versions}"
        assert all(r.get("rollout/failed_infra_frac", 0.0) == 0.0 for r in steps)
        assert all(r["rollout/tool_calls"] > 0 for r in steps), "episodes ran commands in sandboxes"

        figures = asyncio.run(_redis_figures(redis_url))
        assert figures["trainer_pending"] == 0, "every trained group is acknowledged"
        assert figures["tasks_pending"] == 0, "no task is left leased by a worker"
        assert figures["gate"]["running"] == 0, f"every admitted group ended exactly once: {figures['gate']}"
        assert figures["status"]["phase"] == "finished" and figures["policy"] == summary["policy_version"]
        served = httpx.get(local.swaps["http://engine:30000"] + "/get_weight_version", timeout=5).json()
        assert served["weight_version"] == str(summary["policy_version"]), "the engine serves the last policy"
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["config"]["services"]["env_token"] in (None, "***")
        assert TOKEN not in (run_dir / "manifest.json").read_text() + (run_dir / "config.yaml").read_text()
    finally:
        for name in ("rollout-1", "rollout-2", "trainer", "env-server", "engine"):
            if name in procs:
                stop_process(procs[name]) if procs[name].poll() is None else None
        if "redis" in procs:
            procs["redis"].send_signal(signal.SIGTERM)
            procs["redis"].wait(timeout=30)
    assert asyncio.run(_sandboxes_left()) == [], "the env server removed its sandboxes when it stopped"
