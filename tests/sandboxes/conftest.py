"""Fixtures for sandbox tests against the real Docker engine (scripts/setup.sh starts dockerd).

Every container made here carries ``pqrl.run=pytest`` and this process's ``pqrl.owner``, so the
factory can prove at teardown that a test left nothing behind, and remove what it did leave.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from sandboxes.docker import DockerSandbox, owner_id
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings

RUN_LABEL = "pytest"
# Small enough that a runaway test cannot hurt the 24 GB host, large enough for python3 + pytest.
BASE_SETTINGS = SandboxSettings(memory_mb=256)

MakeSandbox = Callable[..., Awaitable[DockerSandbox]]


async def leftover_containers(api: DockerAPI) -> list[dict[str, Any]]:
    """Containers this test process made and did not remove."""
    return await api.list({"pqrl.run": RUN_LABEL, "pqrl.owner": owner_id()})


@pytest.fixture
async def docker_api() -> AsyncIterator[DockerAPI]:
    api = DockerAPI()
    yield api
    await api.close()


@pytest.fixture
async def make_sandbox(docker_api: DockerAPI) -> AsyncIterator[MakeSandbox]:
    """Factory: ``await make_sandbox(memory_mb=128, ...)`` changes BASE_SETTINGS; all closed at teardown.

    Pass ``settings=`` for a complete SandboxSettings instead of changes to the base.
    """
    made: list[DockerSandbox] = []

    async def make(settings: SandboxSettings | None = None, **changes: Any) -> DockerSandbox:
        settings = (settings or BASE_SETTINGS).replace(**changes)
        sb = await DockerSandbox.create(docker_api, settings, run=RUN_LABEL)
        made.append(sb)
        return sb

    yield make
    await asyncio.gather(*(sb.close() for sb in made), return_exceptions=True)
    left = await leftover_containers(docker_api)
    for c in left:  # clean up first, then fail: a leak must not outlive the test that caused it
        with contextlib.suppress(Exception):
            await docker_api.remove(c["Id"])
    assert not left, f"containers left behind: {[c['Names'] for c in left]}"


@pytest.fixture
async def sandbox(make_sandbox: MakeSandbox) -> DockerSandbox:
    """A sandbox with the hardened defaults and a 256 MB memory limit."""
    return await make_sandbox()
