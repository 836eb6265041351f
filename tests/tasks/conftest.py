"""Fixtures of the coding-suite tests: a session manager whose sandboxes must all be gone after."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from env_server.sessions import SessionManager
from sandboxes.docker import owner_id
from sandboxes.docker_api import DockerAPI


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
