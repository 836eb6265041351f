"""Warm pool and reaper against the real Docker engine."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import pytest

from sandboxes.docker import DockerSandbox, owner_id
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from sandboxes.pool import SandboxPool
from sandboxes.protocol import ImageMissing
from sandboxes.reaper import owner_alive, reap

SMALL = SandboxSettings(memory_mb=128)


@pytest.fixture
async def api():
    a = DockerAPI()
    yield a
    await a.close()


async def _exists(api: DockerAPI, cid: str) -> bool:
    return any(c["Id"] == cid for c in await api.list(["pqrl.owner"], all=True))


async def test_pool_hands_out_fresh_sandboxes_and_never_reuses_them(api):
    async with SandboxPool(api, SMALL, size=2, run="pytest-pool") as pool:
        seen = set()
        for _ in range(5):
            sb = await pool.acquire(timeout=60)
            assert sb.id not in seen, "a sandbox was handed out twice"
            seen.add(sb.id)
            marker = await sb.exec("ls /workspace; touch /workspace/used")
            assert marker.stdout == b"", "a fresh sandbox must start with an empty workspace"
            pool.release(sb)
        for _ in range(100):  # the filler refills to the target size
            if pool.idle == 2:
                break
            await asyncio.sleep(0.05)
        assert pool.idle == 2
        assert pool.stats.created >= 7
    await asyncio.sleep(0)
    assert not any([await _exists(api, cid) for cid in seen]), "released sandboxes must be removed"
    assert await api.list({"pqrl.run": "pytest-pool"}) == [], "close() must remove idle sandboxes"


async def test_burst_of_acquires_is_served_within_the_creation_rate_limit(api):
    async with SandboxPool(
        api, SMALL, size=1, run="pytest-burst", max_creates_per_s=5, max_concurrent_creates=2
    ) as pool:
        while pool.idle < 1:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the token bucket refills to its burst of 2
        t0 = time.monotonic()
        got = await asyncio.gather(*(pool.acquire(timeout=60) for _ in range(6)))
        elapsed = time.monotonic() - t0
        assert len({s.id for s in got}) == 6
        # One was warm; the other 5 need creating at 5/s after a burst of 2: >= (5 - 2) / 5 s.
        assert elapsed >= 0.55, f"the rate limiter did not pace creations ({elapsed:.2f}s)"
        for s in got:
            pool.release(s)


async def test_a_pool_of_a_missing_image_fails_at_start_not_after_the_acquire_timeout(api):
    pool = SandboxPool(api, SandboxSettings(image="pqrl-no-such-image:1"), size=1, run="pytest-missing")
    try:
        with pytest.raises(ImageMissing, match="pqrl-no-such-image"):
            await pool.start()
        assert pool.stats.create_failures == 0  # no creation was tried
    finally:
        await pool.close()


async def test_reaper_removes_containers_of_a_crashed_owner(api):
    crashed = textwrap.dedent("""
        import asyncio, os
        from sandboxes.docker import DockerSandbox
        from sandboxes.docker_api import DockerAPI
        from sandboxes.hardening import SandboxSettings
        async def main():
            sb = await DockerSandbox.create(DockerAPI(), SandboxSettings(memory_mb=128), run="pytest-crash")
            print(sb.id, flush=True)
            os._exit(0)  # dies without closing its sandbox
        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", crashed], capture_output=True, text=True, timeout=120)
    cid = out.stdout.strip()
    assert cid, out.stderr
    assert await _exists(api, cid), "the crashed owner's container should still be there before reaping"
    removed = await reap(api)
    assert cid in removed
    assert not await _exists(api, cid)


async def test_reaper_removes_expired_and_stuck_created_containers_but_not_live_ones(api):
    settings = SandboxSettings(memory_mb=128)
    live = await DockerSandbox.create(api, settings, run="pytest-reap")
    try:
        # A container stuck in Created, owned by a process that does not exist.
        dead_owner = f"{owner_id().rsplit(':', 2)[0]}:999999:1"
        labels = {
            "pqrl.run": "pytest-reap",
            "pqrl.session": "s",
            "pqrl.owner": dead_owner,
            "pqrl.expires": "9e12",
        }
        stuck = await api.create(
            "pqrl-stuck-" + str(time.time_ns()),
            settings.container_config(cmd=["true"], labels=labels, uid=200_000),
        )
        # One with a live owner (us) but long expired.
        expired_labels = {**labels, "pqrl.owner": owner_id(), "pqrl.expires": str(int(time.time()) - 10)}
        expired = await api.create(
            "pqrl-expired-" + str(time.time_ns()),
            settings.container_config(cmd=["true"], labels=expired_labels, uid=200_000),
        )
        removed = await reap(api)
        assert stuck in removed and expired in removed
        assert live.id not in removed and await _exists(api, live.id)
        assert (await live.exec("echo alive")).stdout == b"alive\n"
    finally:
        await live.close()


def test_owner_alive_checks_pid_and_start_time():
    me = owner_id()
    assert owner_alive(me)
    host, pid, ticks = me.rsplit(":", 2)
    assert not owner_alive(f"{host}:{pid}:{int(ticks) + 1}"), "a reused pid is not the owner"
    assert not owner_alive(f"{host}:999999:1")
    assert owner_alive("some-other-host:1:1"), "owners on other hosts cannot be checked; expiry handles them"
    assert not owner_alive("garbage")
