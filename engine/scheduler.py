"""The built-in engine's scheduler: one asyncio task that owns the ``BatchEngine``.

Requests wait in a queue; each round the scheduler admits what fits, then runs one engine step
(prefill of the admitted rows + one decode step for all rows) in a worker thread, so the event loop
keeps accepting requests while the model runs. Control operations (abort, pause, weight updates)
take the same lock as a round, so they always land between decode steps: the safe point.

Pause modes follow SGLang: ``abort`` ends every request now (finish reason abort, tokens so far);
``retract`` takes running requests out of the batch and queues them again, to be re-prefilled from
their tokens so far after ``continue``; ``in_place`` just stops stepping. While paused, new requests
queue and wait. Uses only the standard library and the engine module (no web framework).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from engine.batcher import BatchEngine, Sequence

if TYPE_CHECKING:
    import torch

__all__ = ["DuplicateRequest", "EngineScheduler", "PauseMode"]

log = logging.getLogger(__name__)

PauseMode = Literal["abort", "retract", "in_place"]


class DuplicateRequest(ValueError):
    """A request id that is already in flight."""


class EngineScheduler:
    """Serves ``generate`` calls from many coroutines with one continuously batched engine.

    Args:
        engine: the engine; nothing else may call it while the scheduler runs.
    """

    def __init__(self, engine: BatchEngine) -> None:
        self.engine = engine
        self.paused = False
        self._waiting: deque[Sequence] = deque()
        self._futures: dict[str, asyncio.Future[Sequence]] = {}  # rid -> its caller's future
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._background: set[asyncio.Task[int]] = set()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="engine-scheduler")

    async def stop(self) -> None:
        """Stops the loop after its current step; requests still in flight end with finish reason abort."""
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._resolve(
            self.engine.abort(None, "engine shutting down") + self._drain_waiting("engine shutting down")
        )

    # -- requests ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def in_flight(self, rid: str) -> bool:
        return rid in self._futures

    def submit(self, seq: Sequence) -> asyncio.Future[Sequence]:
        """Queues ``seq``; the future resolves to it once finished (stopped, length-limited or aborted).

        Raises:
            DuplicateRequest: a request with the same id is in flight.
        """
        if seq.rid in self._futures:
            raise DuplicateRequest(f"request id {seq.rid!r} is already in flight")
        fut: asyncio.Future[Sequence] = asyncio.get_running_loop().create_future()
        self._futures[seq.rid] = fut
        if seq.params.max_new_tokens <= 0:
            # Nothing to compute: finish at once, as SGLang does.
            seq.finish_reason = {"type": "length", "length": 0}
            seq.weight_version = self.engine.weight_version
            self._resolve([seq])
        else:
            self._waiting.append(seq)
            self._wake.set()
        return fut

    async def generate(self, seq: Sequence) -> Sequence:
        """``submit`` and wait; a cancelled caller aborts its request so it stops using compute."""
        fut = self.submit(seq)
        try:
            return await asyncio.shield(fut)
        finally:
            if not fut.done():
                self.abort_soon(seq.rid, "client went away")

    def abort_soon(self, rid: str, message: str) -> None:
        """Schedules ``abort`` (for callers that cannot await, e.g. while being cancelled)."""
        task = asyncio.get_running_loop().create_task(self.abort(rid, message))
        self._background.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._background.discard)

    async def abort(self, rid: str | None, message: str = "aborted") -> int:
        """Ends request ``rid`` (every request when None) with finish reason abort; returns how many."""
        async with self._lock:
            rids = None if rid is None else {rid}
            ended = self.engine.abort(rids, message) + self._drain_waiting(message, rids)
            self._resolve(ended)
            return len(ended)

    # -- control ----------------------------------------------------------------------------------

    async def update_weights_from_disk(
        self,
        model_path: str | Path,
        *,
        weight_version: str | None = None,
        load_format: str | None = None,
        abort_all_requests: bool = False,
    ) -> int:
        """Loads new weights between decode steps; returns the number of requests in flight then.

        With ``abort_all_requests`` those requests end first (finish reason abort, every token they
        carry generated by the old weights); otherwise they continue with the new weights.
        """
        load = functools.partial(self.engine.load_weights, model_path, load_format)
        return await self._swap_weights(load, weight_version, abort_all_requests)

    async def update_weights_from_tensors(
        self,
        tensors: dict[str, torch.Tensor],
        *,
        weight_version: str | None = None,
        abort_all_requests: bool = False,
    ) -> int:
        """As ``update_weights_from_disk``, with tensors already in memory (e.g. received from a
        trainer); any subset of the model's tensors, checked as a whole before any is copied."""
        load = functools.partial(self.engine.load_state, tensors, source="update_weights_from_distributed")
        return await self._swap_weights(load, weight_version, abort_all_requests)

    async def _swap_weights(
        self, load: Callable[[], None], weight_version: str | None, abort_all_requests: bool
    ) -> int:
        async with self._lock:
            in_flight = len(self.engine.rows) + len(self._waiting)
            if abort_all_requests:
                msg = "aborted for a weight update"
                self._resolve(self.engine.abort(None, msg) + self._drain_waiting(msg))
            await asyncio.to_thread(load)
            if weight_version is not None:
                self.engine.weight_version = weight_version
        self._wake.set()
        return in_flight

    async def pause(self, mode: PauseMode = "abort") -> int:
        """Stops generation (see the module docstring for the modes); returns requests affected."""
        async with self._lock:
            self.paused = True
            if mode == "abort":
                msg = "aborted by pause_generation"
                ended = self.engine.abort(None, msg) + self._drain_waiting(msg)
                self._resolve(ended)
                return len(ended)
            if mode == "retract":
                retracted = self.engine.retract()
                self._waiting.extendleft(reversed(retracted))
                return len(retracted)
            return len(self.engine.rows)

    async def flush_cache(self) -> None:
        """Empties the engine's prefix cache between decode steps."""
        async with self._lock:
            self.engine.flush_cache()

    async def resume(self) -> None:
        """Ends a pause; queued and retracted requests continue."""
        self.paused = False
        self._wake.set()

    def stats(self) -> dict[str, Any]:
        s = self.engine.stats
        return {
            "weight_version": self.engine.weight_version,
            "running": len(self.engine.rows),
            "waiting": len(self._waiting),
            "paused": self.paused,
            **dataclasses.asdict(s),
            "prefix_cache_tokens": self.engine.prefix_cache.tokens,
        }

    # -- the loop ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            if self.paused or not (self._waiting or self.engine.rows):
                self._wake.clear()  # no await since the check: no wake-up can be lost
                await self._wake.wait()
                continue
            async with self._lock:
                if self.paused or self._stopping:
                    continue
                n = self.engine.admissible(list(self._waiting))
                admit = [self._waiting.popleft() for _ in range(n)]
                try:
                    finished = await asyncio.to_thread(self.engine.step, admit)
                except Exception as e:  # e.g. out of memory: fail what was running, keep serving
                    log.exception("engine step failed")
                    self._fail(admit + self.engine.retract(), e)
                    finished = []
            self._resolve(finished)
            await asyncio.sleep(0)  # let handlers queue requests and control calls take the lock

    def _drain_waiting(self, message: str, rids: set[str] | None = None) -> list[Sequence]:
        ended = [s for s in self._waiting if rids is None or s.rid in rids]
        self._waiting = deque(s for s in self._waiting if not (rids is None or s.rid in rids))
        for seq in ended:
            seq.finish_reason = {"type": "abort", "message": message}
            seq.weight_version = self.engine.weight_version
            seq.text = self.engine.response_text(seq)
        return ended

    def _resolve(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            fut = self._futures.pop(seq.rid, None)
            if fut is not None and not fut.done():
                fut.set_result(seq)

    def _fail(self, seqs: list[Sequence], error: Exception) -> None:
        for seq in seqs:
            fut = self._futures.pop(seq.rid, None)
            if fut is not None and not fut.done():
                fut.set_exception(RuntimeError(f"engine step failed: {error}"))
