"""Exec latency of a command that leaves a background child holding its output pipe (``sleep 1000 &
echo started``), the exec agent at a git revision against the working tree's, interleaved in one
run; a plain ``echo`` is the control. Median milliseconds over 2 x 20 calls each.

    python bench/exec_background.py [REV]   # REV: the baseline agent's revision (default HEAD~1)
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sandboxes.docker as docker  # noqa: E402
from sandboxes.docker import DockerSandbox  # noqa: E402
from sandboxes.docker_api import DockerAPI  # noqa: E402
from sandboxes.hardening import SandboxSettings  # noqa: E402


async def medians(sources: dict[str, str], rounds: int = 2, calls: int = 20) -> dict[str, float]:
    api = DockerAPI()
    seen: dict[str, list[float]] = {}
    try:
        for _ in range(rounds):
            for name, source in sources.items():
                docker.AGENT_SOURCE = source
                sb = await DockerSandbox.create(api, SandboxSettings(), run="bench-exec-background")
                try:
                    for label, cmd in ((name, "sleep 1000 & echo started"), (f"{name}_plain", "echo hi")):
                        for _ in range(calls):
                            seen.setdefault(label, []).append((await sb.exec(cmd, timeout=5)).duration)
                finally:
                    await sb.close()
    finally:
        await api.close()
    return {k: round(statistics.median(v) * 1000, 1) for k, v in seen.items()}


def main() -> None:
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD~1"
    old = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:sandboxes/agent.py"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    result = asyncio.run(medians({"old": old, "new": docker.AGENT_SOURCE}))
    result["background_old_over_new"] = round(result["old"] / result["new"], 2)
    print(json.dumps({"baseline": rev, **result}))


if __name__ == "__main__":
    main()
