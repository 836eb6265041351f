"""The generic forgers of tests/tasks/forgers/ on every built-in coding task, with the source policy
off and on: which of them the grader lets score, without the bug being fixed.

    python bench/forgers.py | tee bench/results/forgers_before.log
    python bench/forgers.py --repo [--verdict junit]   # repo-v1 on a real project: bench/forgers_repo.py

Prints, per forger and policy, the tasks scoring > 0 (and any grading that raised: a grader
failure, i.e. ``failed_infra``), then one JSON line of the counts. Every count should be 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning import short_commit  # noqa: E402
from sandboxes.docker_api import DockerAPI  # noqa: E402
from tests.tasks.forgery import FORGERS, TASKS, battery, graders  # noqa: E402


async def main(forgers: list[str]) -> None:
    api = DockerAPI()
    try:
        t0 = time.monotonic()
        results = await battery(graders(api, "bench-forgers"), forgers)
        wall_s = time.monotonic() - t0
    finally:
        await api.close()
    counts: dict[str, dict[str, int]] = {}
    for forger in forgers:
        for policy in (False, True):
            key = "policy_on" if policy else "policy_off"
            rows = {t.id: results[(forger, policy, t.id)] for t in TASKS if (forger, policy, t.id) in results}
            scored = sorted(t for t, r in rows.items() if not isinstance(r, BaseException) and r.reward > 0)
            raised = sorted(t for t, r in rows.items() if isinstance(r, BaseException))
            flagged = sum(
                not isinstance(r, BaseException) and bool(r.info.get("policy_violations"))
                for r in rows.values()
            )
            counts.setdefault(forger, {})[key] = len(scored) + len(raised)
            print(
                f"{forger} {key}: of {len(rows)} tasks it changes, {len(scored)} scored > 0 {scored}; "
                f"{len(raised)} raised {raised}; {flagged} flagged by the policy",
                flush=True,
            )
            for t in raised:
                print(f"  {t}: {rows[t]!r}", flush=True)
    total = sum(v for c in counts.values() for v in c.values())
    print(
        json.dumps(
            {"tasks": len(TASKS), "wall_s": round(wall_s, 1), "nonzero_or_raised": total, "counts": counts}
        )
    )


if __name__ == "__main__" and sys.argv[1:2] == ["--repo"]:
    from bench.forgers_repo import run

    run(sys.argv[2:])
elif __name__ == "__main__":
    chosen = sys.argv[1:] or FORGERS
    commit = short_commit(ROOT)
    print(f"# python bench/forgers.py {' '.join(sys.argv[1:])}".rstrip(), flush=True)
    print(f"# commit {commit}, load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
    asyncio.run(main(chosen))
