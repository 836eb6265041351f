"""When a run's trainer waits for groups that can no longer come: its task plan is over.

No marker is written: the trainer reads the fact from the run's Redis, so it holds with any number of
rollout workers and across restarts. The plan is over when (1) the run's task sampler has handed out
its last slot (its position only grows), (2) the task queue is empty: no task queued and none leased
(a rollout worker writes a group before it acknowledges the task's lease, and a task given up for
staleness is queued again before its lease is acknowledged), and then (3) every group in the stream
has been delivered to the trainer. A run without a sampler (tasks only submitted) never ends this way:
more tasks may be submitted at any time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any

__all__ = ["plan_end_counts", "starved"]


async def _plan_over(store: Any, consumer_group: str) -> bool:
    from tasks.sampler import SamplerConfig, Schedule

    state = await store.sampler.get()
    if state.config is None:
        return False
    if not Schedule(SamplerConfig.from_json(state.config)).exhausted(await store.sampler.position()):
        return False
    if await store.tasks.backlog():
        return False
    return not await store.groups.undelivered(consumer_group)


async def starved(store: Any, trainer: Any, consumer_group: str, every_s: float) -> None:
    """Returns once the trainer's step waits for groups while the plan is over, seen twice ``every_s``
    apart in the same step (longer than one blocking read: a group written before the first look has
    reached the trainer by the second)."""
    from pqrl.store import StoreUnavailable

    seen: int | None = None
    while True:
        await asyncio.sleep(every_s)
        step = trainer.state.step
        over = False
        with contextlib.suppress(StoreUnavailable):  # a restarting Redis: look again later
            over = trainer.waiting and await _plan_over(store, consumer_group) and trainer.waiting
        if over and seen == step:
            return
        seen = step if over else None


async def plan_end_counts(store: Any, trainer: Any, dropped: collections.Counter[str], manager: Any) -> str:
    """Groups produced (run-wide), read by the trainer (the model's history), dropped by reason (this
    process's figures: the trainer's screening and, beside it, the rollout manager's failures)."""
    reasons = collections.Counter(dropped)
    if manager is not None:
        reasons.update({f"rollout {k}": v for k, v in manager.stats.failures.items()})
    why = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()) if v) or "none"
    produced = await store.groups.produced()
    return (
        f"groups produced {produced}, read by the trainer {len(trainer.state.trained_groups)}, dropped: {why}"
    )
