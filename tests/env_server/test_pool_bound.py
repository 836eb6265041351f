"""Warm pools for three images under one total bound, with real sandboxes: the spares never pass
the bound, the least recently used image's pool is closed once nothing of it is lent, and each
new pool's first acquire is measured per image."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest

from env_server.builtin import ShellEnv
from env_server.registry import register_environment
from env_server.sessions import SessionManager
from env_server.types import ToolCall
from sandboxes.hardening import SandboxSettings
from tests.env_server.conftest import RUN_LABEL, leftover_sandboxes, wait_until_gone

pytestmark = pytest.mark.timeout(180)

IMAGES = [f"pqrl-pytest-pool-bound-{x}:latest" for x in "abc"]  # three tags of the base image
POOL, BOUND = 1, 2


class ImageEnva(ShellEnv):
    sandbox_settings = SandboxSettings(image=IMAGES[0], memory_mb=128)


class ImageEnvb(ShellEnv):
    sandbox_settings = SandboxSettings(image=IMAGES[1], memory_mb=128)


class ImageEnvc(ShellEnv):
    sandbox_settings = SandboxSettings(image=IMAGES[2], memory_mb=128)


ENVS = [f"pytest-pool-image-{x}-v1" for x in "abc"]


@pytest.fixture
def three_images(restore_registry) -> Iterator[None]:
    for image in IMAGES:
        subprocess.run(["docker", "tag", "pqrl-sandbox-base:latest", image], check=True)
    for env_id, x in zip(ENVS, "abc", strict=True):
        register_environment(env_id, f"{__name__}:ImageEnv{x}")
    try:
        yield
    finally:
        subprocess.run(["docker", "rmi", *IMAGES], capture_output=True)  # untags: the base stays


async def _settle(manager: SessionManager, pools: int, timeout: float = 30.0) -> None:
    """Waits until every open pool holds the spares it is allowed and ``pools`` are open."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        open_ = manager.sandbox_pools.pools()
        if len(open_) == pools and all(p.idle == p.size and p.warm == p.size for p in open_):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"pools never settled: {[(p.settings.image, p.size, p.warm) for p in open_]}")


async def test_total_warm_bound_holds_across_three_images(docker_api, three_images):
    manager = SessionManager(pool_size=POOL, max_warm=BOUND, run=RUN_LABEL)
    most = 0
    sampling = True

    async def sample() -> None:
        nonlocal most
        while sampling:
            most = max(most, manager.sandbox_pools.warm)
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    try:
        # One image after the other: each new pool starts cold, and the oldest goes once a third comes.
        for i, env_id in enumerate(ENVS):
            info = await manager.create(env_id, {"prompt": "p"})
            out = await manager.step(info.session_id, [_run("cat /etc/hostname >/dev/null; echo ok")])
            assert out.messages[0].content.endswith("ok\n")
            await manager.close(info.session_id)
            await _settle(manager, pools=min(i + 1, BOUND))
        assert sorted(p.settings.image for p in manager.sandbox_pools.pools()) == IMAGES[1:]
        # the engine agrees: no more containers than the bound once the closed pool's are removed
        deadline = time.monotonic() + 15
        while len(await leftover_sandboxes(docker_api)) > BOUND and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert len(await leftover_sandboxes(docker_api)) == BOUND
        assert set(manager.sandbox_pools.cold_starts) == set(IMAGES)
        assert all(0 < s < 60 for s in manager.sandbox_pools.cold_starts.values())
        text = generate_latest(manager.metrics).decode()
        for image in IMAGES:
            assert f'pqrl_env_sandbox_cold_start_seconds{{image="{image}"}}' in text

        # Three sessions at once: every image's pool stays open while it lends, spares still bounded.
        first_a = manager.sandbox_pools.cold_starts[IMAGES[0]]
        held = [await manager.create(env_id, {"prompt": "p"}) for env_id in ENVS]
        assert manager.sandbox_pools.cold_starts[IMAGES[0]] != first_a, "a's pool was reopened cold"
        by_image = {p.settings.image: p for p in manager.sandbox_pools.pools()}
        assert set(by_image) == set(IMAGES) and by_image[IMAGES[0]].size == 0
        reapers = [t for t in asyncio.all_tasks() if "reaper" in t.get_name() and not t.done()]
        assert len(reapers) == 1, f"one reaper for every image's pool, not {len(reapers)}"
        await _settle(manager, pools=3)
        for info in held:
            await manager.close(info.session_id)
        # the next acquire closes the pool that keeps no spare and lends nothing
        info = await manager.create(ENVS[2], {"prompt": "p"})
        await manager.close(info.session_id)
        assert sorted(p.settings.image for p in manager.sandbox_pools.pools()) == IMAGES[1:]
        await _settle(manager, pools=BOUND)
        assert most <= BOUND, f"{most} spares at once, over the bound of {BOUND}"
    finally:
        sampling = False
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await manager.shutdown()
    assert await wait_until_gone(docker_api) == [], "sandboxes outlived the manager"


def _run(command: str) -> ToolCall:
    return ToolCall(id="c1", name="run", arguments={"command": command})
