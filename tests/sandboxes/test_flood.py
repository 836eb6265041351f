"""A sandbox that floods the host channel cannot grow the host's memory: the reader refuses any line
longer than the pending calls can be answered with, removes the container and fails the call.
Commands cannot reach the channel (tests/sandboxes/test_abuse.py), so an altered agent floods it.
Measured in a fresh process, so the peak RSS is its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.sandboxes.agents import FLOOD_COMMAND

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = f"""
import asyncio, json, resource
import sandboxes.docker
from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.protocol import SandboxError
from sandboxes.hardening import SandboxSettings
from tests.sandboxes.agents import flooding_agent_source

async def main():
    sandboxes.docker.AGENT_SOURCE = flooding_agent_source(400_000_000)
    api = DockerAPI()
    sb = await DockerSandbox.create(api, SandboxSettings(memory_mb=256), run="pytest-flood")
    try:
        await sb.exec("echo warm")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            await sb.exec({FLOOD_COMMAND!r}, timeout=60)
            error = None
        except SandboxError as e:
            error = type(e).__name__
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({{"growth_mib": (after - before) / 1024, "error": error, "alive": sb.alive}}))
    finally:
        await sb.close()
        await api.close()

asyncio.run(main())
"""


def test_a_newline_free_flood_of_400_mib_is_cut_and_the_sandbox_removed():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] == "SandboxFlooded", result
    assert not result["alive"], "the flooding sandbox must not serve further calls"
    assert result["growth_mib"] < 64, result
