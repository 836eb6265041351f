"""The coding grader, end to end in real containers: correctness on every built-in task, the cost of
the held-out expectations, and the forgers.

    python bench/grader.py | tee bench/results/grader.log

Prints, then one JSON line:
- ``gold_ones`` / ``empty_zeros``: of the 66 tasks, gold patches scoring 1 and empty patches 0;
- ``cold_s`` / ``warm_s``: wall time to grade every gold patch with the gold records not yet
  computed (each task's first grading computes it: two extra test runs) and again with them
  cached, at the grader's default concurrency; their ratio is the one-time price per task;
- ``forged``: for each forger of the hack battery, its reward with the source policy off and on.
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
from sandboxes.docker import DockerSandbox  # noqa: E402
from sandboxes.docker_api import DockerAPI  # noqa: E402
from sandboxes.hardening import SandboxSettings  # noqa: E402
from tasks.coding.diffs import unified_diff  # noqa: E402
from tasks.coding.env import builtin_suite  # noqa: E402
from tasks.coding.grader import CodingGrader  # noqa: E402
from tests.tasks.test_coding_hacks import FORGERS, SOURCE, TASK  # noqa: E402


async def main() -> None:
    api = DockerAPI()

    async def make() -> DockerSandbox:
        return await DockerSandbox.create(api, SandboxSettings(memory_mb=512), run="bench-grader")

    tasks = list(builtin_suite().tasks)
    grader = CodingGrader(make)
    try:
        t0 = time.monotonic()
        cold = await asyncio.gather(*(grader.grade_patch(t, t.gold_patch or "") for t in tasks))
        cold_s = time.monotonic() - t0
        t0 = time.monotonic()
        warm = await asyncio.gather(*(grader.grade_patch(t, t.gold_patch or "") for t in tasks))
        warm_s = time.monotonic() - t0
        empty = await asyncio.gather(*(grader.grade_patch(t, "") for t in tasks))
        forged = {}
        for name, prefix, _ in FORGERS:
            patch = unified_diff("roman.py", SOURCE, prefix + SOURCE)
            rewards = []
            for policy in (False, True):
                result = await CodingGrader(make, source_policy=policy, test_timeout=30).grade_patch(
                    TASK, patch
                )
                rewards.append(result.reward)
            forged[name] = {"policy_off": rewards[0], "policy_on": rewards[1]}
            print(f"{name}: {forged[name]}", file=sys.stderr)
    finally:
        await api.close()
    print(
        json.dumps(
            {
                "tasks": len(tasks),
                "gold_ones": min(sum(r.reward == 1.0 for r in rs) for rs in (cold, warm)),
                "empty_zeros": sum(r.reward == 0.0 for r in empty),
                "cold_s": round(cold_s, 1),
                "warm_s": round(warm_s, 1),
                "cold_over_warm": round(cold_s / warm_s, 2),
                "forged_nonzero": sum(v != 0.0 for f in forged.values() for v in f.values()),
                "forged": forged,
            }
        )
    )


if __name__ == "__main__":
    commit = short_commit(ROOT)
    print(f"# commit {commit}, load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
    asyncio.run(main())
