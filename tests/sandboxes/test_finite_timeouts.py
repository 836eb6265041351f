"""A NaN or infinite timeout can make neither side wait forever, against a real Docker engine: the
host refuses it before anything is sent, the in-sandbox agent refuses it when a request carries one
anyway (it used to spin at the container's whole CPU quota), and the shell tool's clamp holds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from env_server.builtin import ShellEnv
from env_server.types import ToolCall, ToolStatus
from sandboxes.docker import DockerSandbox
from sandboxes.hardening import SandboxSettings
from sandboxes.pool import SandboxPool
from tests.sandboxes.probing import assert_only_the_agent, assert_responsive

pytestmark = pytest.mark.timeout(90)

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("timeout", [NAN, INF, -INF, 0.0, -1.0, 10**400])
async def test_the_host_refuses_a_timeout_that_is_not_a_finite_positive_number(sandbox, timeout):
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="timeout must be"):
        await sandbox.exec("sleep 30", timeout=timeout)
    assert time.monotonic() - t0 < 1.0
    await assert_responsive(sandbox)


async def test_a_huge_finite_timeout_is_cut_to_the_sandboxes_lifetime(make_sandbox):
    sb = await make_sandbox(lifetime_s=120.0)
    r = await sb.exec("echo fine", timeout=1e300)
    assert r.ok and r.stdout == b"fine\n"


@pytest.mark.parametrize("field", ["cpus", "lifetime_s"])
@pytest.mark.parametrize("value", [NAN, INF])
def test_sandbox_settings_refuse_a_non_finite_cpu_share_or_lifetime(field, value):
    with pytest.raises(ValueError, match="must be finite and > 0"):
        SandboxSettings(**{field: value})


@pytest.mark.parametrize("field", ["max_creates_per_s", "max_idle_s", "reap_interval_s"])
async def test_a_pool_refuses_non_finite_rates_and_intervals(docker_api, field):
    with pytest.raises(ValueError, match=f"{field} must be a finite number"):
        SandboxPool(docker_api, size=0, run="pytest-finite", **{field: NAN})


async def _raw_exec(sb: DockerSandbox, timeout_json: str) -> dict[str, Any]:
    """An exec request written to the agent as is (the host would never send it), and its reply."""
    rid = next(sb._ids)
    reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    sb._pending[rid] = reply
    sb._calls[rid] = ("exec", 1 << 20)
    line = f'{{"id": {rid}, "op": "exec", "cmd": "sleep 30", "timeout": {timeout_json}, "cap": 1024}}\n'
    try:
        await sb._stream.write(line.encode())
        return await asyncio.wait_for(reply, 5.0)
    finally:
        sb._pending.pop(rid, None)
        sb._calls.pop(rid, None)


@pytest.mark.parametrize("timeout_json", ["NaN", "Infinity", "-Infinity", "1e999", "0", "-5", '"30"', "true"])
async def test_the_agent_refuses_a_bad_timeout_promptly_and_runs_nothing(sandbox, timeout_json):
    t0 = time.monotonic()
    reply = await _raw_exec(sandbox, timeout_json)
    assert time.monotonic() - t0 < 2.0, "the agent ran the command instead of refusing it"
    assert reply["ok"] is False and reply["error"] == "ValueError", reply
    assert "timeout must be a finite number of seconds > 0" in reply["message"], reply
    await assert_only_the_agent(sandbox)  # no sleep left running, no spinning thread's command
    await assert_responsive(sandbox)


async def test_the_shell_tool_refuses_a_nan_timeout_and_clamps_a_huge_one(sandbox):
    env = ShellEnv()
    env.sandbox = sandbox
    await env.reset(task={"prompt": "p"})
    calls = [
        ToolCall("run", {"command": "sleep 30", "timeout": NAN}, id="nan"),
        ToolCall("run", {"command": "sleep 30", "timeout": "inf"}, id="inf"),
        ToolCall("run", {"command": "echo ran", "timeout": 1e300}, id="huge"),
    ]
    t0 = time.monotonic()
    nan, inf, huge = (await env.step(calls)).messages
    assert time.monotonic() - t0 < 5.0
    for m in (nan, inf):
        assert m.status is ToolStatus.INVALID and "timeout: Input should be a finite number" in m.content, m
    assert huge.status is ToolStatus.OK and huge.content == "[exit code 0]\nran\n", huge
