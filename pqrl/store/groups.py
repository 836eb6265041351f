"""The stream of a run's finished groups, read by trainers through consumer groups.

Each entry is one GRPO group (one binary blob, pqrl.codec) and goes to one consumer of each
consumer group (``XREADGROUP`` + ``XACK``); a consumer that dies leaves its entries pending and
``reclaim`` hands them to another (``XAUTOCLAIM``). Acknowledging trims the stream below the oldest
entry some consumer group still needs, so the backlog is the data some consumer still needs, and
``put`` refuses new groups while it is at ``max_backlog``: back-pressure that releases as the
trainer consumes, without ever dropping unread data. The bound is exact for one producer and may
be overshot by one group per additional concurrent producer. Entries that fail to decode go to the
dead letters.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import redis.asyncio as aioredis

from pqrl.codec import CodecError, decode_many, encode_parts
from pqrl.store._streams import AckAndTrim, Entry, autoclaim, create_consumer_group, read_new
from pqrl.store.connection import Backpressure, RunKeys, RunPart, decode_str, redis_errors
from pqrl.store.dead_letters import DeadLetters
from pqrl.store.parts import Parts, packs_parts
from pqrl.trajectory import Trajectory

__all__ = ["GroupEntry", "GroupStream"]


@dataclass(frozen=True, slots=True)
class GroupEntry:
    """One finished group as read from the stream; ack ``entry_id`` once it is used."""

    entry_id: str
    trajectories: list[Trajectory]
    delivery_count: int = 1


class GroupStream(RunPart):
    """The stream ``keys.groups``; ``max_backlog`` 0 means unbounded."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: RunKeys,
        url_redacted: str,
        *,
        dead_letters: DeadLetters,
        max_backlog: int,
    ) -> None:
        super().__init__(redis, keys, url_redacted)
        self.dead_letters = dead_letters
        self.max_backlog = max_backlog
        self._backlog_hint = 0  # XLEN as last seen by this producer; trims only lower the truth
        self._streams = AckAndTrim(redis)
        # One value sent from the records' own arrays where the client takes Parts (what
        # store.connection.connect makes), else joined into one blob first.
        self._value: Callable[[list[bytes | np.ndarray]], Parts | bytes] = (
            Parts if packs_parts(redis) else _joined
        )

    @property
    def key(self) -> str:
        return self.keys.groups

    # ---------------------------------------------------------------- producers

    async def try_put(self, trajectories: Sequence[Trajectory]) -> str | None:
        """Appends one finished group; returns its entry id, or None when the backlog is full."""
        entry_id, _ = await self._try_add(trajectories)
        return entry_id

    async def put(self, trajectories: Sequence[Trajectory], *, timeout: float = 0.0) -> str:
        """Appends one finished group, waiting up to ``timeout`` seconds for backlog space.

        The records' arrays are sent from where they are (pqrl.store.parts): nothing may write to
        their memory through another view once the put has started, even if it fails.

        Raises:
            Backpressure: the backlog stayed full for ``timeout`` seconds (at once when 0).
        """
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            entry_id, backlog = await self._try_add(trajectories)
            if entry_id is not None:
                return entry_id
            if time.monotonic() + delay > deadline:
                raise Backpressure(backlog, self.max_backlog)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    @redis_errors
    async def _try_add(self, trajectories: Sequence[Trajectory]) -> tuple[str | None, int]:
        # No Lua here: passing ~0.5 MB of blobs through a script costs more than the add itself.
        # Look before adding only when the last length seen leaves no room, so the bound is exact
        # for one producer and overshoots by at most one group per other concurrent producer.
        _check_group(trajectories, self.run_id)
        if self.max_backlog and self._backlog_hint + 1 >= self.max_backlog:
            self._backlog_hint = int(await self.redis.xlen(self.key))
            if self._backlog_hint >= self.max_backlog:
                return None, self._backlog_hint
        # Any: Parts is a value type the client learns from sends_parts, unknown to redis-py's types.
        fields: dict[Any, Any] = {"group": self._value(encode_parts(trajectories))}
        if not self.max_backlog:  # unbounded: no length to keep track of, one XADD
            return decode_str(await self.redis.xadd(self.key, fields)), 0
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(self.key, fields)
            pipe.xlen(self.key)
            entry_id, backlog = await pipe.execute()
        self._backlog_hint = int(backlog)
        return decode_str(entry_id), self._backlog_hint

    @redis_errors
    async def backlog(self) -> int:
        """Groups in the stream that some consumer group has not acknowledged (or not read)."""
        return int(await self.redis.xlen(self.key))

    # ---------------------------------------------------------------- consumers

    @redis_errors
    async def create_consumer_group(self, consumer_group: str, *, from_start: bool = True) -> None:
        """Creates ``consumer_group`` (idempotent). ``from_start`` also delivers entries already queued."""
        await create_consumer_group(self.redis, self.key, consumer_group, from_start)

    @redis_errors
    async def read(
        self, consumer_group: str, consumer: str, *, count: int = 1, block_ms: int | None = None
    ) -> list[GroupEntry]:
        """Delivers up to ``count`` new groups to ``consumer``; each must be acked once used.

        Entries that fail to decode are moved to the dead-letter stream with the reason (nothing
        is dropped), acknowledged, logged, and left out of the result.
        """
        raw = await read_new(self.redis, self.key, consumer_group, consumer, count, block_ms)
        return await self._decode_entries(consumer_group, raw)

    @redis_errors
    async def read_own_pending(
        self, consumer_group: str, consumer: str, *, count: int = 100
    ) -> list[GroupEntry]:
        """Groups delivered to ``consumer`` before and never acknowledged, oldest first.

        A restarted trainer (same consumer name) reads these first: the groups it had taken but not
        yet covered by a checkpoint when it stopped.
        """
        reply = cast(
            list[tuple[bytes, list[Entry]]],
            await self.redis.xreadgroup(consumer_group, consumer, {self.key: "0"}, count=count),
        )
        raw = [(i, f) for i, f in (reply[0][1] if reply else []) if f]
        return await self._decode_entries(consumer_group, raw)

    @redis_errors
    async def ack(self, consumer_group: str, entry_ids: Iterable[str]) -> int:
        """Acknowledges entries for ``consumer_group`` and trims what every one has acknowledged."""
        return await self._streams.ack(self.key, consumer_group, entry_ids)

    @redis_errors
    async def reclaim(
        self, consumer_group: str, consumer: str, *, min_idle_ms: int, count: int = 100
    ) -> list[GroupEntry]:
        """Takes over groups another consumer of ``consumer_group`` read but did not ack in time."""
        raw = await autoclaim(self.redis, self.key, consumer_group, consumer, min_idle_ms, count)
        entries = await self._decode_entries(consumer_group, raw)
        if not entries:
            return entries
        counts = await self._delivery_counts(consumer_group, [e.entry_id for e in entries])
        return [GroupEntry(e.entry_id, e.trajectories, counts.get(e.entry_id, 1)) for e in entries]

    @redis_errors
    async def trim_acknowledged(self) -> int:
        """Trims the prefix every consumer group has acknowledged; returns entries removed."""
        return await self._streams.trim(self.key)

    @redis_errors
    async def pending(self, consumer_group: str) -> int:
        """Groups delivered to ``consumer_group`` but not yet acknowledged."""
        return int((await self.redis.xpending(self.key, consumer_group))["pending"])

    @redis_errors
    async def produced(self) -> int:
        """Groups ever written to the stream (trimmed ones included)."""
        if not await self.redis.exists(self.key):
            return 0
        return int((await self.redis.xinfo_stream(self.key))["entries-added"])

    @redis_errors
    async def undelivered(self, consumer_group: str) -> bool:
        """Whether the stream holds a group not yet delivered to any consumer of ``consumer_group``."""
        if not await self.redis.exists(self.key):
            return False
        last = decode_str((await self.redis.xinfo_stream(self.key))["last-generated-id"])
        for g in await self.redis.xinfo_groups(self.key):
            if decode_str(g["name"]) == consumer_group:
                return decode_str(g["last-delivered-id"]) != last
        return int(await self.redis.xlen(self.key)) > 0

    @redis_errors
    async def peek(self, count: int) -> list[tuple[str, list[Trajectory] | CodecError]]:
        """The ``count`` most recent groups, oldest first, without consuming them (inspection).

        A corrupt entry comes back as its CodecError and stays where it is.
        """
        out: list[tuple[str, list[Trajectory] | CodecError]] = []
        rows = cast(list[Entry], await self.redis.xrevrange(self.key, count=count))
        for entry_id, fields in reversed(rows):
            try:
                out.append((decode_str(entry_id), _decode_group(fields)))
            except CodecError as e:
                out.append((decode_str(entry_id), e))
        return out

    async def _decode_entries(self, consumer_group: str, raw: list[Entry]) -> list[GroupEntry]:
        out: list[GroupEntry] = []
        for entry_id, fields in raw:
            eid = decode_str(entry_id)
            try:
                out.append(GroupEntry(eid, _decode_group(fields)))
            except CodecError as e:
                await self.dead_letters.put(consumer_group, eid, fields, str(e))
        return out

    async def _delivery_counts(self, consumer_group: str, ids: list[str]) -> dict[str, int]:
        reply = await self.redis.xpending_range(
            self.key, consumer_group, min=ids[0], max=ids[-1], count=len(ids)
        )
        rows = cast(list[dict[str, Any]], reply)  # RESP2, undecoded: one map per pending entry
        return {decode_str(r["message_id"]): int(r["times_delivered"]) for r in rows}


def _check_group(trajectories: Sequence[Trajectory], run_id: str) -> None:
    if not trajectories:
        raise ValueError("a group needs at least one trajectory")
    for i, t in enumerate(trajectories):
        if not isinstance(t, Trajectory):
            raise TypeError(f"group member {i} is {type(t).__name__}, not Trajectory")
    group_id = trajectories[0].group_id
    for t in trajectories:
        if t.run_id != run_id:
            raise ValueError(f"trajectory {t.id} belongs to run {t.run_id!r}, not {run_id!r}")
        if t.group_id != group_id:
            raise ValueError(f"trajectory {t.id} has group_id {t.group_id!r}, expected {group_id!r}")


def _joined(parts: list[bytes | np.ndarray]) -> bytes:
    # numpy's stubs declare ndarray's buffer protocol for Python 3.12+ only; it has one on 3.11 too.
    return b"".join(parts)  # type: ignore[arg-type]


def _decode_group(fields: dict[bytes, bytes]) -> list[Trajectory]:
    if list(fields) != [b"group"]:
        raise CodecError(f"group entry has fields {sorted(fields)}, expected only b'group'")
    group = decode_many(fields[b"group"])
    if not group:
        raise CodecError("group entry holds no trajectories")
    return group
