"""Suites in Redis: each stored once by content hash, and fed into a run's task queue.

Two ways in, both ending as leases of the run's task queue (a consumer group, see pqrl.store):
``SuiteStore.submit`` queues each task of a suite once; ``SuiteStore.configure_sampler`` gives the
run a task sampler (tasks.sampler: epochs, seeded shuffling, mixing weights) whose slots
``RunSampler.claim`` hands out one at a time. A manager takes the queue first (reclaimed leases,
then submitted tasks) and claims from the sampler only when the queue has nothing for it.

The claim of slot ``k`` is one Lua script (``store.sampler.claim``, pqrl.store.sampler): if the
run's position is still ``k`` it becomes ``k + 1``, the slot's task (computed by the caller from the
schedule) is appended to the queue, and the oldest undelivered task is leased to the caller. A
caller that lost the race gets the new position and retries with that slot; so two managers, on any
machines, never claim the same slot, and a manager that dies after claiming leaves a pending lease
that another reclaims after its lease timeout, as with submitted tasks. The position is the only
state: a run resumed on a Redis that lost it sets the checkpoint's position
(``store.sampler.set_position``) and continues with that slot. On a Redis that kept it, keep the
larger of the two: the slots between them are already queued or leased, and setting the position
back would hand them out again.

Deliberately left out: slots leased but unfinished when a checkpoint was taken are not re-issued
on a fresh Redis (their leases went with it); a suite both submitted and sampled runs twice.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, NamedTuple

import redis.asyncio as aioredis

from pqrl.store import StoreError, TaskEntry, TrajectoryStore
from tasks.rewards import queued_terms
from tasks.sampler import SamplerConfig, Schedule, SuiteShare, skips
from tasks.suite import Suite, parse_suite

__all__ = ["RunSampler", "SuiteStore", "WeightedSuite", "fetch_suite", "queued_task", "task_key"]

_INDEX = "pqrl:suites"  # hash: digest -> {"id", "name", "version", "kind", "env_id", "tasks"}


def queued_task(suite: Suite, task_index: int) -> dict[str, Any]:
    """What a rollout worker takes from the queue: the task and how to run it."""
    t = suite.tasks[task_index]
    queued = {"suite": suite.id, "env_id": suite.manifest.env_id, "env_kwargs": suite.manifest.defaults,
              "task_id": t.id, "task": t.model_dump()}  # fmt: skip
    reward = queued_terms(suite.manifest.reward)
    return queued if reward is None else {**queued, "reward": reward}


class WeightedSuite(NamedTuple):
    suite: Suite
    weight: float = 1.0


async def fetch_suite(redis: aioredis.Redis, suite_id: str) -> Suite:
    """A stored suite by its exact id, ``name@digest``."""
    text = await redis.get(f"pqrl:suite:{suite_id.rsplit('@', 1)[-1]}")
    if text is None:
        raise KeyError(f"suite {suite_id} is not stored")
    return parse_suite(text.decode(), source=suite_id)


class SuiteStore:
    """Stored suites, shared by every run on one Redis."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.redis = aioredis.Redis.from_url(url, decode_responses=False, socket_connect_timeout=5)

    async def aclose(self) -> None:
        await self.redis.aclose()

    async def save(self, suite: Suite) -> bool:
        """Stores the suite once; returns False when the same content was stored before."""
        new = await self.redis.set(f"pqrl:suite:{suite.digest}", suite.to_jsonl(), nx=True)
        m = suite.manifest
        meta = {"id": suite.id, "name": m.name, "version": m.version, "kind": m.kind, "env_id": m.env_id,
                "tasks": len(suite.tasks)}  # fmt: skip
        await self.redis.hset(_INDEX, suite.digest, json.dumps(meta))
        return bool(new)

    async def list(self) -> list[dict[str, Any]]:
        rows = await self.redis.hgetall(_INDEX)
        return sorted(
            (json.loads(v) for v in rows.values()), key=lambda m: (m["name"], m["version"], m["id"])
        )

    async def get(self, ref: str) -> Suite:
        """A stored suite by ``name@digest``, digest (or a unique prefix of it), or unique name."""
        metas = await self.list()
        digest = ref.split("@", 1)[1] if "@" in ref else ref
        hits = [m for m in metas if m["id"].split("@")[1].startswith(digest) or m["name"] == ref]
        if not hits:
            raise KeyError(f"no stored suite matches {ref!r}")
        if len(hits) > 1:
            raise KeyError(f"{ref!r} is ambiguous: {', '.join(m['id'] for m in hits)}")
        text = await self.redis.get(f"pqrl:suite:{hits[0]['id'].split('@')[1]}")
        return parse_suite(text.decode(), source=hits[0]["id"])

    async def submit(self, suite: Suite, run_id: str) -> int | None:
        """Stores the suite and queues its tasks for ``run_id``; None if the run has them already."""
        await self.save(suite)
        store = TrajectoryStore(self.url, run_id)
        try:
            return await store.tasks.push_once(
                suite.id, (queued_task(suite, i) for i in range(len(suite.tasks)))
            )
        finally:
            await store.close()

    async def configure_sampler(
        self,
        run_id: str,
        suites: list[WeightedSuite],
        *,
        epochs: int | None = None,
        seed: int = 0,
        skip_flat: int = 0,
        grow_epochs: bool = False,
    ) -> SamplerConfig:
        """Stores the suites and gives ``run_id`` a task sampler over them.

        Configuring the same sampler again (a resumed run) keeps its position. ``grow_epochs``: the
        epochs were derived from a step budget, not asked for, so a run whose sampler differs only
        in them takes the larger number and keeps its position: a job resumed with more steps gets
        a plan that covers them. The slots after the position are then drawn from the longer
        schedule (the suites' mix is spread over all its epochs), so the tasks of the epoch in
        progress may differ from the first plan's; the slots already claimed stay claimed.

        Raises:
            StoreError: the run already has a different sampler.
        """
        shares = tuple(SuiteShare(ws.suite.id, len(ws.suite.tasks), float(ws.weight)) for ws in suites)
        config = SamplerConfig(shares, epochs, seed, skip_flat)
        for ws in suites:
            await self.save(ws.suite)
        store = TrajectoryStore(self.url, run_id)
        try:
            try:
                await store.sampler.configure(config.to_json())
            except StoreError:
                if not grow_epochs:
                    raise
                return await _grown(store, config)
        finally:
            await store.close()
        return config


async def _grown(store: TrajectoryStore, config: SamplerConfig) -> SamplerConfig:
    """The run's sampler with ``config``'s epochs where those are more; StoreError if it differs
    from ``config`` in anything else."""
    pinned_text = (await store.sampler.get()).config or ""
    pinned = SamplerConfig.from_json(pinned_text)
    if dataclasses.replace(pinned, epochs=config.epochs) != config:
        raise StoreError(f"the run has another task sampler: {pinned_text}")
    if (config.epochs or 0) <= (pinned.epochs or 0):
        return pinned
    await store.sampler.replace(pinned_text, config.to_json())
    return config


class RunSampler:
    """Claims the slots of a run's task sampler as leases of its task queue (see the module docstring).

    Build it with ``load``; several instances (managers) may share one run.
    """

    def __init__(self, store: TrajectoryStore, schedule: Schedule, suites: dict[str, Suite]) -> None:
        self.store, self.schedule, self.suites = store, schedule, suites
        self._config_text = schedule.config.to_json()

    @classmethod
    async def load(cls, store: TrajectoryStore) -> RunSampler | None:
        """The run's sampler with its suites read from Redis; None when the run has none."""
        state = await store.sampler.get()
        if state.config is None:
            return None
        config = SamplerConfig.from_json(state.config)
        suites = {s.suite_id: await fetch_suite(store.redis, s.suite_id) for s in config.suites}
        for s in config.suites:
            if len(suites[s.suite_id].tasks) != s.n_tasks:
                raise ValueError(
                    f"suite {s.suite_id} has {len(suites[s.suite_id].tasks)} tasks, not {s.n_tasks}"
                )
        return cls(store, Schedule(config), suites)

    async def position(self) -> int:
        return await self.store.sampler.position()

    def task(self, k: int) -> dict[str, Any]:
        """What slot ``k`` queues: the task as ``submit`` queues it, with its slot and epoch."""
        slot = self.schedule.slot(k)
        return {**queued_task(self.suites[slot.suite_id], slot.task_index), "epoch": slot.epoch, "slot": k}

    async def claim(self, consumer_group: str, consumer: str) -> TaskEntry | None:
        """Claims the next slot and leases a task to ``consumer``; None once the schedule is over.
        Slots whose task gives them up (``tasks.sampler.skips``) are passed over."""
        await self._refresh()
        k = await self.position()
        skip_flat = self.schedule.config.skip_flat
        while not self.schedule.exhausted(k):
            task = self.task(k)
            if skip_flat:
                key = task_key(task)
                seen = await self.store.sampler.outcome(key)
                if skips(seen.flat, seen.skipped, skip_flat):
                    k = await self.store.sampler.skip(position=k, task_key=key)
                    continue
            got = await self.store.sampler.claim(consumer_group, consumer, position=k, task=task)
            if got.entry is not None:
                return got.entry
            k = got.position  # another manager claimed slot k first
        return None

    async def _refresh(self) -> None:
        """Takes the run's sampler config again when a resumed trainer has grown its epochs since
        this instance loaded it: a running worker draws the slots as the trainer's plan does, and
        does not end at the old plan's end."""
        text = (await self.store.sampler.get()).config
        if text is not None and text != self._config_text:
            self.schedule, self._config_text = Schedule(SamplerConfig.from_json(text)), text

    async def record(self, task: dict[str, Any], rewards: list[float]) -> None:
        """A group of ``task`` ran with these rewards (kept only when the sampler skips flat tasks)."""
        if self.schedule.config.skip_flat and "slot" in task:
            await self.store.sampler.record(task_key(task), signal=len(set(rewards)) > 1)


def task_key(task: dict[str, Any]) -> str:
    """A queued task's name across the run's suites."""
    return f"{task['suite']}/{task['task_id']}"
