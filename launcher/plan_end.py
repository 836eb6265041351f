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


_GROUP_DROPS = ("no_signal_groups", "groups_too_few_valid", "duplicate_groups")  # the rest count episodes


async def plan_end_counts(store: Any, trainer: Any, dropped: collections.Counter[str], manager: Any) -> str:
    """Groups produced (run-wide), read by the trainer (the model's history), and dropped by reason:
    by the trainer's screening in this process, and by the rollout manager beside it (role ``all``)
    with its failures (episodes and groups)."""
    produced = await store.groups.produced()
    # with the step that waits: the groups without signal it read are dropped too
    dropped = dropped + collections.Counter(no_signal_groups=trainer.flat_read)
    by_trainer = ", ".join(f"{k} {dropped[k]}" for k in _GROUP_DROPS if dropped[k]) or "none"
    out = (
        f"groups produced {produced}, read by the trainer {len(trainer.state.trained_groups)}, "
        f"dropped by the trainer: {by_trainer}"
    )
    if manager is not None:
        failures = ", ".join(f"{k} {v}" for k, v in sorted(manager.stats.failures.items()) if v) or "none"
        out += f"; by the rollout side: {manager.stats.groups_dropped} (failures: {failures})"
    return out
