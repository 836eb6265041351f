"""Fixtures of the suite tests: an in-process env client, and for the coding suite a session manager
and graders whose sandboxes must all be gone after."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from env_server.client import LocalEnvClient
from env_server.sessions import SessionManager
from sandboxes.docker import DockerSandbox, owner_id
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from tasks.coding.grader import CodingGrader


async def leftovers(api: DockerAPI, run: str, timeout: float = 15.0) -> list[dict]:
    """This process's containers of ``run``, after waiting for background destruction."""
    deadline = time.monotonic() + timeout  # pools destroy released sandboxes in the background
    while (
        left := await api.list({"pqrl.run": run, "pqrl.owner": owner_id()})
    ) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return left


@pytest.fixture
async def manager(request) -> AsyncIterator[SessionManager]:
    """A SessionManager labelled with the test module's ``RUN``; fails the test if it leaks."""
    run = request.module.RUN
    m = SessionManager(pool_size=0, run=run)
    api = DockerAPI()
    try:
        yield m
    finally:
        await m.shutdown()
        left = await leftovers(api, run)
        for c in left:
            with contextlib.suppress(Exception):
                await api.remove(c["Id"])
        await api.close()
        assert not left, f"containers left behind: {[c['Names'] for c in left]}"


@pytest.fixture
async def graders(request) -> AsyncIterator[dict[bool, CodingGrader]]:
    """Coding graders with the source policy on (True) and off (False), their sandboxes labelled
    with the test module's ``RUN``; fails the test if one is left behind."""
    run = request.module.RUN
    api = DockerAPI()

    async def make() -> DockerSandbox:
        return await DockerSandbox.create(api, SandboxSettings(memory_mb=512), run=run)

    yield {policy: CodingGrader(make, source_policy=policy, test_timeout=30) for policy in (True, False)}
    left = await leftovers(api, run)
    await api.close()
    assert left == []


@pytest.fixture
async def client() -> AsyncIterator[LocalEnvClient]:
    """Sessions in this process, closed after the test."""
    c = LocalEnvClient()
    yield c
    await c.aclose()
