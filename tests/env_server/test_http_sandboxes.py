"""The env server over real HTTP with real sandboxes: a sandbox that dies or is broken by its own
command, a reset that crashes, and sandboxes released by the pool and the idle reaper."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from env_server.client import HttpEnvClient, LocalEnvClient
from env_server.registry import register_environment
from env_server.sessions import (
    EnvironmentBroken,
    InfraFailure,
    NotFound,
    SessionDone,
    SessionManager,
)
from env_server.types import ToolStatus
from sandboxes.docker_api import DockerError
from tests.env_server.conftest import (
    ECHO_TASK,
    RUN_LABEL,
    SHELL_TASK,
    call,
    error_of,
    serve_in_thread,
    wait_until_gone,
)
from tests.env_server.envs import BadSetupOnReset
from tests.sandboxes.agents import FLOOD_COMMAND, flooding_agent_source

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- sandboxes


async def _sandbox_of(manager: SessionManager, session_id: str) -> str:
    sandbox = manager._sessions[session_id].sandbox
    assert sandbox is not None and sandbox.alive
    return sandbox.id


async def test_dead_sandbox_is_an_infra_failure_over_http(docker_api):
    with serve_in_thread() as live:
        c = HttpEnvClient(live.url, token=live.token, retries=0)
        try:
            a = await c.create_session("shell-v1", SHELL_TASK)
            b = await c.create_session("shell-v1", SHELL_TASK)
            ok = await c.step(a.session_id, [call("run", command="echo alive")])
            assert ok.messages[0].content == "[exit code 0]\nalive\n"
            for s in (a, b):
                await docker_api.kill(await _sandbox_of(live.manager, s.session_id))
            with pytest.raises(InfraFailure, match="sandbox failed"):
                await c.step(a.session_id, [call("run", command="echo dead")])
            async with httpx.AsyncClient(base_url=live.url, headers=live.auth, timeout=30) as raw:
                run = {"tool_calls": [{"name": "run", "arguments": {"command": "true"}}]}
                r = await raw.post(f"/sessions/{b.session_id}/step", json=run)
                status, code, detail = error_of(r)
                assert (status, code) == (502, "infra_failure") and "sandbox failed" in detail, detail
                after = await raw.post(
                    f"/sessions/{a.session_id}/step", json={"tool_calls": [{"name": "submit"}]}
                )
                assert error_of(after)[:2] == (409, "session_done"), (
                    "the session must be done after an infra failure"
                )
            with pytest.raises(InfraFailure):
                await c.evaluate(a.session_id)
            for s in (a, b):
                await c.close_session(s.session_id)
            assert live.healthz()["sessions"] == 0
        finally:
            await c.aclose()
    assert await wait_until_gone(docker_api) == [], "sandboxes outlived the server"


async def test_dead_sandbox_is_an_infra_failure_in_process(docker_api):
    manager = SessionManager(pool_size=0, run=RUN_LABEL)
    local = LocalEnvClient(manager)
    try:
        info = await local.create_session("shell-v1", SHELL_TASK)
        write = await local.step(info.session_id, [call("write_file", path="hello.txt", content="hi")])
        assert write.messages[0].content == "wrote 2 characters to /workspace/hello.txt"
        assert (await local.evaluate(info.session_id)).reward == 1.0
        await docker_api.kill(await _sandbox_of(manager, info.session_id))
        with pytest.raises(InfraFailure):
            await local.step(info.session_id, [call("read_file", path="hello.txt")])
        with pytest.raises(SessionDone):
            await local.step(info.session_id, [call("submit")])
        await local.close_session(info.session_id)
    finally:
        await local.aclose()
    assert await wait_until_gone(docker_api) == []


# Memory in a memfd belongs to no process, so the OOM killer takes the largest one: the agent.
MEMFD_BOMB = (
    'python3 -c \'import itertools, os; fd = os.memfd_create("m"); '
    "any(os.write(fd, bytes(1 << 20)) < 0 for _ in itertools.count())'"
)


@pytest.mark.parametrize(
    "command",
    [MEMFD_BOMB, FLOOD_COMMAND],
    ids=["oom_kill_the_agent", "flood_the_channel"],
)
async def test_a_command_that_breaks_its_own_sandbox_scores_zero_not_failed_infra(
    docker_api, monkeypatch, command
):
    """The policy's own doing is its failure: the episode ends, evaluates to 0 with the cause, and
    is never an infrastructure failure (which would be retried and left out of training)."""
    if command == FLOOD_COMMAND:  # commands cannot reach the host channel: an altered agent floods it
        monkeypatch.setattr("sandboxes.docker.AGENT_SOURCE", flooding_agent_source())
    manager = SessionManager(pool_size=0, run=RUN_LABEL)
    local = LocalEnvClient(manager)
    try:
        info = await local.create_session("shell-v1", SHELL_TASK)
        await local.step(info.session_id, [call("write_file", path="hello.txt", content="hi")])
        result = await local.step(info.session_id, [call("run", id="c1", command=command)])
        assert result.done and result.messages[0].status is ToolStatus.ERROR, result
        assert result.messages[0].tool_call_id == "c1" and "sandbox stopped" in result.messages[0].content
        reward = await local.evaluate(info.session_id)
        assert reward.reward == 0.0 and reward.info["cause"], reward
        with pytest.raises(SessionDone):
            await local.step(info.session_id, [call("submit")])
        await local.close_session(info.session_id)
    finally:
        await local.aclose()
    assert await wait_until_gone(docker_api) == []


async def test_reset_crash_releases_the_sandbox(docker_api, restore_registry):
    register_environment("pytest-crash-v1", "tests.env_server.envs:SandboxCrashOnReset")
    manager = SessionManager(pool_size=0, run=RUN_LABEL)
    try:
        with pytest.raises(Exception, match="reset crashed"):
            await manager.create("pytest-crash-v1", {})
        assert manager.live == 0
    finally:
        await manager.shutdown()  # destroys what the pool holds; an acquired sandbox is the session's
    assert await wait_until_gone(docker_api, timeout=2) == [], "the sandbox of a failed reset leaked"


LONG_DEST = "/workspace/" + "d" * 3000


@pytest.mark.parametrize(
    ("dest", "says"),
    [("/workspace", "upload '/workspace' in sandbox: ReadError"),  # no builtin type: SandboxCallFailed
     (LONG_DEST, "upload '/workspace/ddd")],  # an OSError (name too long) answered for the call
)  # fmt: skip
async def test_a_failed_sandbox_call_in_reset_is_the_environments_error_once(
    docker_api, restore_registry, dest, says
):
    """The reset's own setup call fails (the sandbox is alive): a bounded environment_error naming
    the environment and the call, answered at once and not retried by the client (the same setup
    fails the same way), with the sandbox released and the server still serving."""
    register_environment("pytest-bad-setup-v1", "tests.env_server.envs:BadSetupOnReset")
    BadSetupOnReset.resets = 0
    with serve_in_thread() as live:
        async with httpx.AsyncClient(base_url=live.url, headers=live.auth, timeout=30) as raw:
            r = await raw.post("/sessions", json={"env_id": "pytest-bad-setup-v1", "task": {"dest": dest}})
        status, code, detail = error_of(r)
        assert (status, code) == (500, "environment_error"), detail
        assert detail.startswith("pytest-bad-setup-v1: reset failed: a sandbox call of its setup failed: "), (
            detail
        )
        assert says in detail and len(detail) < 1000, detail
        c = HttpEnvClient(live.url, token=live.token, retries=3, backoff_s=0.01)
        try:
            with pytest.raises(EnvironmentBroken, match="sandbox call of its setup failed") as raised:
                await c.create_session("pytest-bad-setup-v1", {"dest": dest})
            assert raised.value.status == 500
            assert BadSetupOnReset.resets == 2, "the client retried a reset that fails the same way"
            assert live.healthz()["sessions"] == 0
            assert (await c.create_session("echo-v1", ECHO_TASK)).session_id, "the server stopped serving"
        finally:
            await c.aclose()
    assert await wait_until_gone(docker_api) == [], "the sandbox of a failed reset leaked"


async def test_pool_size_zero_keeps_no_idle_sandbox(docker_api):
    manager = SessionManager(pool_size=0, run=RUN_LABEL)
    try:
        info = await manager.create("shell-v1", SHELL_TASK)
        pool = next(iter(manager._pools.values()))
        deadline = time.monotonic() + 1.5
        while pool.idle == 0 and pool.stats.created < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert (pool.stats.created, pool.idle) == (1, 0), "a spare sandbox was made"
        await manager.close(info.session_id)
    finally:
        await manager.shutdown()


async def test_idle_sessions_are_reaped_and_release_their_sandbox(docker_api, ttl_server):
    c = HttpEnvClient(ttl_server.url, token=ttl_server.token, retries=0)
    try:
        idle = await c.create_session("shell-v1", SHELL_TASK)
        busy = await c.create_session("echo-v1", ECHO_TASK)
        cid = await _sandbox_of(ttl_server.manager, idle.session_id)
        deadline = time.monotonic() + 1.5  # three TTLs: the busy session is used every 0.1 s
        while time.monotonic() < deadline:
            await c.evaluate(busy.session_id)
            await asyncio.sleep(0.1)
        assert idle.session_id not in ttl_server.manager._sessions, "an idle session was not reaped"
        with pytest.raises(NotFound):
            await c.step(idle.session_id, [call("submit")])
        assert (await c.evaluate(busy.session_id)).reward == 0.0, "a busy session was reaped"
        for _ in range(100):  # the pool removes released sandboxes in the background
            try:
                await docker_api.inspect(cid)
            except DockerError as e:
                assert e.status == 404
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the reaped session's sandbox {cid[:12]} still exists")
    finally:
        await c.aclose()
