"""Chaos in the deployed topology: does a run survive its services dying?

compose.yaml's services run as local processes (``launcher.compose_local``): Redis (appendfsync
always), one built-in engine, one env server with Docker sandboxes, two rollout workers and a
trainer, on a short sandboxed job. While it runs, faults are injected at random moments (seeded):
SIGKILL a rollout worker (restarted), SIGKILL the env server and restart it, SIGKILL the engine and
restart it, SIGKILL Redis and restart it on its data, SIGKILL the trainer and restart it. Every
kind happens at least once per seed; a process that exits with an error is restarted (as compose's
``restart: on-failure`` would).

Afterwards, from Redis and the run's files: groups lost (stored but neither trained nor still in the
stream: ``entries-added`` of the stream minus consumed minus left; must be 0), groups trained twice
(must be 0), whether the policy version ever went back, containers left, episodes rerun (the
workers' infrastructure retries). One JSON line per seed and a summary line last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.compose_local import LocalTopology  # noqa: E402

RUN = "chaos"
FAULTS = ("rollout", "env-server", "engine", "redis", "trainer")


def _job(path: Path, steps: int) -> None:
    import yaml

    path.write_text(yaml.safe_dump({
        "run": RUN, "tensorboard": False,
        "tasks": {"suites": [{"generate": "data", "n": 64, "format_reward": 0.2}]},
        "rollout": {"group_size": 4, "max_turns": 3, "max_new_tokens": 48, "max_total_tokens": 1024,
                    "temperature": 0.7, "max_concurrent_groups": 1, "max_staleness": 2,
                    "lease_timeout_s": 20},
        "train": {"steps": steps, "groups_per_step": 2, "lr": 1e-5, "read_timeout_s": 900,
                  "max_extra_reads": 2},
        "checkpoint": {"every": 1},
    }))  # fmt: skip


def _log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class _Chaos:
    def __init__(self, topology: LocalTopology, rng: random.Random) -> None:
        self.t, self.rng = topology, rng
        self.injected: dict[str, int] = dict.fromkeys(FAULTS, 0)
        self.restarts = 0

    def fault(self, kind: str) -> None:
        t = self.t
        name = self.rng.choice(["rollout-1", "rollout-2"]) if kind == "rollout" else kind
        if t.procs[name].poll() is not None:
            return  # already gone (a finished worker): nothing to kill
        _log(f"SIGKILL {name}")
        t.kill(name)
        self.injected[kind] += 1
        time.sleep(self.rng.uniform(0.5, 3.0))
        t.start(name)
        if name == "redis":
            t.wait_redis()
        elif name in ("engine", "env-server"):
            t.wait_healthy(name)

    def supervise(self) -> bool:
        """Restarts whatever failed; True once the trainer finished."""
        for name, proc in list(self.t.procs.items()):
            code = proc.poll()
            if code is None or code == 0:
                continue
            _log(f"{name} exited with {code}: restarting it")
            self.restarts += 1
            self.t.start(name)
        return self.t.procs["trainer"].poll() == 0


async def _stream_figures(url: str) -> dict:
    from pqrl.store import TrajectoryStore

    async with TrajectoryStore(url, RUN) as store:
        info = await store.redis.xinfo_stream(store.groups.key)
        return {"entries_added": int(info["entries-added"]), "left": int(info["length"]),
                "gate": await store.gate.state(), "policy": (await store.policy.get()).version}  # fmt: skip


async def _containers() -> int:
    from sandboxes.docker_api import DockerAPI

    api = DockerAPI()
    try:
        return len(await api.list({"pqrl.run": RUN}))
    finally:
        await api.close()


def _summaries(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"groups_written"')]


def run_seed(seed: int, steps: int, faults: int, workdir: Path) -> dict:
    rng = random.Random(seed)
    t = LocalTopology(
        workdir, {"PQRL_ENV_TOKEN": f"chaos-{seed}", "PQRL_CONFIG": "chaos.yaml", "PQRL_RUN": RUN}
    )
    _job(workdir / "config" / "chaos.yaml", steps)
    chaos = _Chaos(t, rng)
    plan = list(FAULTS) + [rng.choice(FAULTS) for _ in range(max(0, faults - len(FAULTS)))]
    rng.shuffle(plan)
    started = time.monotonic()
    try:
        t.start("redis")
        t.wait_redis()
        for name in ("engine", "env-server"):
            t.start(name)
            t.wait_healthy(name)
        for name in ("trainer", "rollout-1", "rollout-2"):
            t.start(name)
        next_fault = time.monotonic() + rng.uniform(40, 90)
        while not chaos.supervise():
            if time.monotonic() - started > 3600:
                raise RuntimeError("the run did not finish within an hour")
            if plan and time.monotonic() > next_fault:
                chaos.fault(plan.pop())
                next_fault = time.monotonic() + rng.uniform(30, 80)
            time.sleep(1.0)
        for name in ("rollout-1", "rollout-2"):  # they stop once the trainer reports the run finished
            t.procs[name].wait(timeout=300)
        figures = asyncio.run(_stream_figures(t.redis_url))
    finally:
        t.stop_all()
    run_dir = workdir / "runs" / RUN
    ckpt = run_dir / "checkpoints"
    state = json.loads((ckpt / (ckpt / "latest").read_text().strip() / "state.json").read_text())
    trained = state["trained_groups"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    versions = [r["policy/version"] for r in rows if "policy/version" in r]
    duplicates = sum(r.get("dropped/duplicate_groups", 0) for r in rows)
    workers = [s for n in ("rollout-1", "rollout-2") for s in _summaries(t.log(n))]
    return {
        "seed": seed,
        "steps": state["step"],
        "minutes": round((time.monotonic() - started) / 60, 1),
        "faults_injected": sum(chaos.injected.values()),
        "faults_by_kind": chaos.injected,
        "unplanned_restarts": chaos.restarts,
        "episodes_rerun": sum(w["failures"].get("infra_retry", 0) for w in workers),
        "groups_stored": figures["entries_added"],
        "groups_trained": len(trained),
        "groups_lost": figures["entries_added"] - len(set(trained)) - int(duplicates) - figures["left"],
        "groups_trained_twice": len(trained) - len(set(trained)),
        "duplicate_copies_skipped": int(duplicates),
        "version_went_back": any(b < a for a, b in zip(versions, versions[1:], strict=False)),
        "containers_left": asyncio.run(_containers()),
        "gate_at_end": figures["gate"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--faults", type=int, default=6, help="faults per seed (every kind at least once)")
    args = ap.parse_args()
    results = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        workdir = Path(tempfile.mkdtemp(prefix=f"pqrl-chaos-{seed}-"))
        try:
            results.append(run_seed(seed, args.steps, args.faults, workdir))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print(json.dumps(results[-1]), flush=True)
    print(json.dumps({
        "seeds": len(results),
        "faults_injected": sum(r["faults_injected"] for r in results),
        "episodes_rerun": sum(r["episodes_rerun"] for r in results),
        "groups_lost": sum(r["groups_lost"] for r in results),
        "groups_trained_twice": sum(r["groups_trained_twice"] for r in results),
        "version_went_back": any(r["version_went_back"] for r in results),
        "containers_left": sum(r["containers_left"] for r in results),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
