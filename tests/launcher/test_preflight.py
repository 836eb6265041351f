"""The checks a job makes before it leases a task, against a real env server process whose Docker is
unreachable: readiness is required only of a job whose environments need sandboxes."""

from __future__ import annotations

import time

import pytest

from env_server.client import HttpEnvClient, LocalEnvClient
from launcher.preflight import check_env_servers
from pqrl.errors import PermanentFault
from pqrl.redis_server import free_port
from tests.servers import env_server_process

TOKEN = "preflight"


@pytest.fixture(scope="module")
def dockerless():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", "unix:///nonexistent")
        with env_server_process(TOKEN) as server:
            yield server


async def test_environments_without_sandboxes_need_no_docker(dockerless):
    env = HttpEnvClient(dockerless.url, token=TOKEN)
    try:
        t0 = time.monotonic()
        await check_env_servers(env, {"calc-v1", "echo-v1"}, grace_s=30)
        assert time.monotonic() - t0 < 5
    finally:
        await env.aclose()


async def test_a_sandboxed_environment_waits_for_readiness_only_within_the_grace(dockerless):
    env = HttpEnvClient(dockerless.url, token=TOKEN)
    try:
        t0 = time.monotonic()
        with pytest.raises(PermanentFault, match=r"not ready after 1\.5 s .*unix:///nonexistent") as e:
            await check_env_servers(env, {"calc-v1", "shell-v1"}, grace_s=1.5)
        assert 1.5 <= time.monotonic() - t0 < 8 and "DOCKER_HOST" in e.value.fix
    finally:
        await env.aclose()


async def test_a_wrong_token_and_an_unknown_environment_are_refused_at_once(dockerless):
    wrong = HttpEnvClient(dockerless.url, token="wrong")
    right = HttpEnvClient(dockerless.url, token=TOKEN)
    local = LocalEnvClient()
    try:
        with pytest.raises(PermanentFault, match="403 invalid token") as e:
            await check_env_servers(wrong, {"calc-v1"}, grace_s=30)
        assert "token" in e.value.fix
        with pytest.raises(PermanentFault, match=f"server {dockerless.url} has no environment nope-v1"):
            await check_env_servers(right, {"calc-v1", "nope-v1"}, grace_s=30)
        with pytest.raises(PermanentFault, match="this process has no environment nope-v1"):
            await check_env_servers(local, {"nope-v1"}, grace_s=30)
    finally:
        await wrong.aclose()
        await right.aclose()
        await local.aclose()


async def test_an_env_server_that_never_answers_is_a_fault_after_the_grace():
    env = HttpEnvClient(f"http://127.0.0.1:{free_port()}", token=TOKEN, retries=0)
    try:
        with pytest.raises(PermanentFault, match="unreachable after 1 s") as e:
            await check_env_servers(env, {"calc-v1"}, grace_s=1)
        assert "URL" in e.value.fix
    finally:
        await env.aclose()
