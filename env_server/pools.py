"""The env server's warm pools, one per ``SandboxSettings`` (so one per image), bounded in total.

A suite of repository tasks has an image per repository version, hundreds of them: one warm pool
each at full size would keep hundreds of idle containers. So the spares of all pools together
stay within ``max_warm``: the pools used most recently keep ``pool_size`` spares each until the
bound is spent, the others keep none, and a pool that keeps none and lends no sandbox is closed.
A spare still being made for a pool just shrunk counts until it is destroyed, and no pool starts a
spare while the total is at the bound, so the bound holds at every moment; a sandbox for a waiting
acquire is never held back by it.
One reaper serves every pool (a pass removes leftovers of any image), run by the set, not per pool.
A pool for an image not seen before starts cold; how long its first sandbox took is a metric per
image (``pqrl_env_sandbox_cold_start_seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict

from prometheus_client import CollectorRegistry, Gauge, Histogram

from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from sandboxes.pool import SandboxPool
from sandboxes.reaper import reap, reap_every

__all__ = ["REAP_EVERY_S", "PoolSet"]

log = logging.getLogger(__name__)
REAP_EVERY_S = 60.0


class PoolSet:
    """Lends sandboxes from per-settings pools, least recently used pools shrunk first."""

    def __init__(
        self,
        metrics: CollectorRegistry,
        *,
        pool_size: int,
        max_warm: int | None,
        run: str,
        docker_api: DockerAPI | None,
    ) -> None:
        self.pool_size = pool_size
        self.max_warm = 2 * pool_size if max_warm is None else max_warm
        if pool_size < 0 or self.max_warm < 0:
            raise ValueError("pool_size >= 0 and max_warm >= 0 required")
        self.run = run
        self.docker_api = docker_api
        self.cold_starts: dict[str, float] = {}  # image -> seconds its pool's first sandbox took
        self._pools: OrderedDict[SandboxSettings, SandboxPool] = OrderedDict()  # oldest use first
        self._lent: dict[SandboxSettings, int] = {}  # sandboxes out (or being acquired) per pool
        self._lock = asyncio.Lock()
        self._reaper: asyncio.Task[None] | None = None
        self.reaped = 0  # containers of dead owners or past their lifetime removed so far
        # Read at scrape time: the spares, and how many sandboxes the pools have made so far.
        gauge = [
            ("pqrl_env_sandbox_pool_idle", "Sandboxes ready in the warm pools", lambda: self.sum("idle")),
            ("pqrl_env_sandbox_pool_created", "Sandboxes the pools created", lambda: self.sum("created")),
            ("pqrl_env_sandbox_pool_create_failures", "Failed creations", lambda: self.sum("failures")),
            ("pqrl_env_sandbox_pools", "Warm pools open, one per image", lambda: len(self._pools)),
            ("pqrl_env_sandbox_pool_warm", "Spares held or being made, all pools", lambda: self.warm),
        ]  # fmt: skip
        for name, doc, read in gauge:
            Gauge(name, doc, registry=metrics).set_function(read)
        self._cold = Gauge(
            "pqrl_env_sandbox_cold_start_seconds",
            "First-acquire latency of the latest pool opened for an image",
            ["image"],
            registry=metrics,
        )
        self._acquire = Histogram(
            "pqrl_env_sandbox_acquire_seconds", "Time to get a sandbox", ["pool"], registry=metrics,
            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        )  # fmt: skip

    @property
    def warm(self) -> int:
        return sum(p.warm for p in self._pools.values())

    def sum(self, what: str) -> int:
        pools = self._pools.values()
        if what == "idle":
            return sum(p.idle for p in pools)
        return sum(p.stats.created if what == "created" else p.stats.create_failures for p in pools)

    def pools(self) -> list[SandboxPool]:
        return list(self._pools.values())

    async def acquire(self, settings: SandboxSettings) -> tuple[SandboxPool, DockerSandbox]:
        """A sandbox with ``settings`` and the pool to give it back to (``release``)."""
        t0 = time.perf_counter()
        pool, new = await self._pool(settings)
        try:
            sandbox = await pool.acquire()
        except BaseException:
            self.release(pool, None)
            raise
        took = time.perf_counter() - t0
        self._acquire.labels("new" if new else "open").observe(took)
        if new:
            self.cold_starts[settings.image] = took
            self._cold.labels(settings.image).set(took)
        return pool, sandbox

    def release(self, pool: SandboxPool, sandbox: DockerSandbox | None) -> None:
        """Gives back what ``acquire`` lent (``None``: the acquire failed); destroys the sandbox."""
        if sandbox is not None:
            pool.release(sandbox)
        left = self._lent.get(pool.settings, 0) - 1
        if left > 0:
            self._lent[pool.settings] = left
        else:
            self._lent.pop(pool.settings, None)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        pools = list(self._pools.values())
        self._pools.clear()
        for pool in pools:
            await pool.close()

    async def _pool(self, settings: SandboxSettings) -> tuple[SandboxPool, bool]:
        async with self._lock:
            pool = self._pools.get(settings)
            new = pool is None
            if pool is None:
                if self.docker_api is None:
                    self.docker_api = DockerAPI()
                if self._reaper is None:
                    self._reaper = asyncio.create_task(self._reap(self.docker_api), name="sandbox-reaper")
                pool = SandboxPool(self.docker_api, settings, size=0, run=self.run, reap_interval_s=None)
                pool.spare_allowed = lambda: self.warm < self.max_warm
                pool.on_change = self._wake_all
                await pool.start()
                self._pools[settings] = pool
            self._pools.move_to_end(settings)
            self._lent[settings] = self._lent.get(settings, 0) + 1
            retired = self._rebalance()
        for old in retired:  # outside the lock: other images' acquires need not wait for this
            await old.close()
        if retired:
            self._wake_all()
        return pool, new

    async def _reap(self, api: DockerAPI) -> None:
        try:
            self.reaped += len(await reap(api))  # leftovers of crashed processes, before any spare
        except Exception as e:
            log.warning("reaper pass failed: %s", e)
        async for removed in reap_every(api, REAP_EVERY_S):
            self.reaped += removed

    def _wake_all(self) -> None:
        for pool in self._pools.values():
            pool.wake()

    def _rebalance(self) -> list[SandboxPool]:
        """Shares ``max_warm`` out, most recently used pool first; returns the pools to close."""
        budget, retired = self.max_warm, []
        for settings, pool in reversed(list(self._pools.items())):
            share = min(self.pool_size, budget)
            budget -= share
            if share == 0 and not self._lent.get(settings):
                del self._pools[settings]
                retired.append(pool)
            elif pool.size != share:
                pool.resize(share)
        return retired
