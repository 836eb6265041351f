"""``pqrl status``: a running job's step, policy version, queue, staleness and reward trend, read from
its Redis (the embedded job's own is found through its run directory)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from pqrl.envvars import checked_redis_url, setting
from pqrl.errors import UsageError

__all__ = ["add_status_arguments", "status_command"]


def add_status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True)
    p.add_argument("--redis-url", default=None, help="default: $PQRL_REDIS_URL, else the embedded job's own")
    p.add_argument("--output-dir", default="runs", help="where an embedded job keeps its run directory")


def status_command(args: argparse.Namespace) -> int:
    url = args.redis_url or setting("PQRL_REDIS_URL")
    services = Path(args.output_dir) / args.run / "services.json"
    if not url and services.is_file():
        url = json.loads(services.read_text())["redis_url"]
    if url:
        checked_redis_url(url)
    else:
        raise UsageError(f"no Redis URL and no running embedded job at {services}",
                         fix="give --redis-url or set PQRL_REDIS_URL")  # fmt: skip

    async def read() -> dict[str, Any]:
        from pqrl.store import TrajectoryStore

        async with TrajectoryStore(url, args.run) as store:
            return {
                "status": await store.status.get(),
                "policy": (await store.policy.get()).version,
                "gate": await store.gate.state(),
                "backlog": await store.groups.backlog(),
                "tasks_queued": int(await store.redis.xlen(store.tasks.key)),
            }

    s = asyncio.run(read())
    st = s["status"]
    if not st:
        print(
            f"run {args.run}: no trainer has reported yet "
            f"(policy v{s['policy']}, {s['backlog']} groups stored)"
        )
        return 1
    age = time.time() - st.get("updated", time.time())
    print(
        f"run {args.run}: {st.get('phase')} step {st.get('step')}/{st.get('steps')}, "
        f"policy v{s['policy']} (updated {age:.0f}s ago)"
    )
    print(f"  groups: {s['backlog']} stored, gate {s['gate']}, {s['tasks_queued']} task entries queued")
    print(f"  staleness of last step: {st.get('staleness')}, engine mismatch k1 {st.get('mismatch_kl')}")
    print(f"  reward trend (last {len(st.get('reward_trend', []))} steps): {st.get('reward_trend')}")
    print(f"  rollout failures by kind: {st.get('failures') or 'none'}")
    print(f"  made of: {st.get('manifest') or _local_gist(Path(args.output_dir) / args.run)}")
    return 0


def _local_gist(run_dir: Path) -> str:
    """The run directory's manifest when the trainer has not reported one (an older trainer)."""
    from launcher.manifest import manifest_gist

    path = run_dir / "manifest.json"
    return manifest_gist(json.loads(path.read_text())) if path.is_file() else "unknown (no manifest)"
