"""Suites in Redis: each stored once by content hash, and submitted into a run's task queue."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from pqrl.store import TrajectoryStore
from tasks.suite import Suite, parse_suite

__all__ = ["SuiteStore", "queued_task"]

_INDEX = "pqrl:suites"  # hash: digest -> {"id", "name", "version", "kind", "env_id", "tasks"}


def queued_task(suite: Suite, task_index: int) -> dict[str, Any]:
    """What a rollout worker takes from the queue: the task and how to run it."""
    t = suite.tasks[task_index]
    return {"suite": suite.id, "env_id": suite.manifest.env_id, "env_kwargs": suite.manifest.defaults,
            "task_id": t.id, "task": t.model_dump()}  # fmt: skip


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
            return await store.push_tasks_once(
                suite.id, (queued_task(suite, i) for i in range(len(suite.tasks)))
            )
        finally:
            await store.close()
