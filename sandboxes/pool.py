"""Warm pool: sandboxes created ahead of demand, handed out in milliseconds, never reused.

One pool serves one ``SandboxSettings`` (image and limits); ``resize`` changes how many spares it
keeps (the env server shrinks the pools of images not used lately). A sandbox given out by ``acquire`` is
never given out again: ``release`` destroys it in the background and the filler creates a fresh
one, at most ``max_creates_per_s`` a second and ``max_concurrent_creates`` at a time, so a burst
of demand does not overload dockerd. The pool runs the reaper on start and every
``reap_interval_s``, so containers of crashed processes do not pile up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from pqrl.finite import finite
from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from sandboxes.protocol import ImageMissing, SandboxError
from sandboxes.reaper import reap, reap_every

__all__ = ["PoolStats", "SandboxPool"]

log = logging.getLogger(__name__)


@dataclass
class PoolStats:
    created: int = 0
    destroyed: int = 0
    create_failures: int = 0
    discarded_stale: int = 0
    reaped: int = 0


class _RateLimiter:
    """Token bucket: at most ``rate`` acquisitions per second, bursts up to ``burst``."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    async def wait(self) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await asyncio.sleep((1 - self.tokens) / self.rate)


class SandboxPool:
    """Keeps ``size`` started sandboxes ready. Use ``async with SandboxPool(...) as pool``."""

    def __init__(
        self,
        api: DockerAPI,
        settings: SandboxSettings | None = None,
        *,
        size: int = 4,
        run: str = "default",
        max_creates_per_s: float = 20.0,
        max_concurrent_creates: int = 4,
        max_idle_s: float | None = None,
        reap_interval_s: float | None = 60.0,
    ) -> None:
        if size < 0 or max_creates_per_s <= 0 or max_concurrent_creates < 1:
            raise ValueError("size >= 0, max_creates_per_s > 0 and max_concurrent_creates >= 1 required")
        for name, value in [("max_creates_per_s", max_creates_per_s), ("max_idle_s", max_idle_s),
                            ("reap_interval_s", reap_interval_s)]:  # fmt: skip
            if value is not None:
                finite(value, name)  # NaN passes the comparisons above and below
        self.api = api
        self.settings = settings or SandboxSettings()
        self.size = size
        self.run = run
        # An idle sandbox older than this is replaced, so a rollout gets most of the lifetime.
        self.max_idle_s = self.settings.lifetime_s / 2 if max_idle_s is None else max_idle_s
        self.reap_interval_s = reap_interval_s
        self.stats = PoolStats()
        self._idle: asyncio.Queue[tuple[float, DockerSandbox]] = asyncio.Queue()
        self._creating = 0
        self._waiters = 0
        self._limiter = _RateLimiter(max_creates_per_s, burst=max(1, max_concurrent_creates))
        self._create_slots = asyncio.Semaphore(max_concurrent_creates)
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._filler: asyncio.Task[None] | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        self._last_error: BaseException | None = None
        # A bound shared with other pools (env_server.pools): may one more spare be made now, and
        # who to tell when this pool's spares drop. Creations for a waiting acquire never wait.
        self.spare_allowed: Callable[[], bool] = lambda: True
        self.on_change: Callable[[], None] = lambda: None

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Checks the engine and image, reaps leftovers, and starts filling."""
        await self.api.ping()
        if not await self.api.image_exists(self.settings.image):  # else every creation fails, retried
            raise ImageMissing(f"sandbox image {self.settings.image!r} is not in the engine")
        if self.reap_interval_s is not None:  # None: whoever owns this pool reaps (env_server.pools)
            self.stats.reaped += len(await reap(self.api))
            reaping = self._reap_loop(self.reap_interval_s)
            self._reaper = asyncio.create_task(reaping, name="sandbox-pool-reaper")
        self._filler = asyncio.create_task(self._fill_loop(), name="sandbox-pool-filler")

    @property
    def idle(self) -> int:
        return self._idle.qsize()

    async def acquire(self, *, timeout: float = 120.0) -> DockerSandbox:
        """A fresh started sandbox for one rollout; give it back with ``release``."""
        if self._closed:
            raise SandboxError("sandbox pool is closed")
        deadline = time.monotonic() + timeout
        self._waiters += 1
        waiting = True
        self._wake.set()
        try:
            while True:
                try:
                    # No wait_for: its inner task would let the filler run between the dequeue and
                    # the bookkeeping below, and count this served waiter as demand for a spare.
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        born, sandbox = await self._idle.get()
                except TimeoutError:
                    cause = f": last creation error: {self._last_error}" if self._last_error else ""
                    raise SandboxError(f"no sandbox became ready within {timeout:.0f}s{cause}") from None
                if sandbox.alive and time.monotonic() - born <= self.max_idle_s:
                    # Served: stop counting as demand before the filler looks, or it makes a spare.
                    self._waiters -= 1
                    waiting = False
                    self._wake.set()  # one fewer idle: the filler tops up to the pool size
                    return sandbox
                self.stats.discarded_stale += 1
                self._destroy(sandbox)
                self._wake.set()
                self.on_change()
        finally:
            if waiting:
                self._waiters -= 1

    @property
    def warm(self) -> int:
        """Spare sandboxes held or being made (beyond the acquires waiting for one): what this
        pool costs while nobody uses it."""
        return max(0, self._idle.qsize() + self._creating - self._waiters)

    def wake(self) -> None:
        """Looks again whether a spare is missing (another pool's spare went: the bound has room)."""
        self._wake.set()

    def resize(self, size: int) -> None:
        """Keeps ``size`` spares from now on; spares beyond it (and beyond waiters) go at once."""
        if size < 0:
            raise ValueError("size >= 0 required")
        self.size = size
        while self._idle.qsize() > max(size, self._waiters):
            self._destroy(self._idle.get_nowait()[1])
        self._wake.set()
        self.on_change()

    def release(self, sandbox: DockerSandbox) -> None:
        """Destroys a used sandbox in the background (sandboxes are never reused)."""
        self._destroy(sandbox)

    async def close(self) -> None:
        """Stops filling and destroys every sandbox the pool still holds."""
        self._closed = True
        for task in (self._filler, self._reaper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # Creations in flight finish into the idle queue first, then everything idle is destroyed.
        for _ in range(2):
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            while not self._idle.empty():
                self._destroy(self._idle.get_nowait()[1])

    # ---------------------------------------------------------------- internals

    def _destroy(self, sandbox: DockerSandbox) -> None:
        task = asyncio.create_task(sandbox.close())
        self._tasks.add(task)
        task.add_done_callback(self._destroyed)

    def _destroyed(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("destroying a sandbox failed: %r", task.exception())
        else:
            self.stats.destroyed += 1

    def _deficit(self) -> int:
        need = max(self.size, self._waiters) - self._idle.qsize() - self._creating
        only_spares = self._waiters <= self._idle.qsize() + self._creating
        if need > 0 and only_spares and not self.spare_allowed():
            return 0  # the bound shared with other pools has no room: on_change of theirs wakes us
        return need

    async def _fill_loop(self) -> None:
        while not self._closed:
            if self._deficit() <= 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._limiter.wait()
            await self._create_slots.acquire()
            if self._deficit() <= 0:  # looked at again with no await before the count goes up
                self._create_slots.release()
                continue
            self._creating += 1
            task = asyncio.create_task(self._create_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _create_one(self) -> None:
        try:
            sandbox = await DockerSandbox.create(
                self.api, self.settings, run=self.run, session=f"pool-{uuid.uuid4().hex}"
            )
            self.stats.created += 1
            self._last_error = None
            if self._closed or self._idle.qsize() >= max(self.size, self._waiters):
                self._destroy(sandbox)  # shrunk or closed while it was being made: not a spare
            else:
                await self._idle.put((time.monotonic(), sandbox))
        except Exception as e:
            self.stats.create_failures += 1
            self._last_error = e
            log.warning("sandbox creation failed: %s", e)
            await asyncio.sleep(1.0)  # do not hammer a failing engine
        finally:
            self._creating -= 1
            self._create_slots.release()
            self._wake.set()
            self.on_change()

    async def _reap_loop(self, every_s: float) -> None:
        async for removed in reap_every(self.api, every_s):
            self.stats.reaped += removed
