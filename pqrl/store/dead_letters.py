"""The run's dead letters: group entries that failed to decode, kept with the reason, never dropped."""

from __future__ import annotations

import logging
from typing import Any, cast

import redis.asyncio as aioredis

from pqrl.store._streams import AckAndTrim, Entry
from pqrl.store.connection import RunKeys, RunPart, decode_str, redis_errors

__all__ = ["DeadLetters"]

log = logging.getLogger(__name__)


class DeadLetters(RunPart):
    """The stream ``keys.dead``: one entry per corrupt group entry, with its original fields."""

    def __init__(self, redis: aioredis.Redis, keys: RunKeys, url_redacted: str) -> None:
        super().__init__(redis, keys, url_redacted)
        self._streams = AckAndTrim(redis)

    @property
    def key(self) -> str:
        return self.keys.dead

    async def put(self, consumer_group: str, entry_id: str, fields: dict[bytes, bytes], reason: str) -> None:
        """Moves group entry ``entry_id``, read by ``consumer_group``, here (logged as an error).

        The copy and the ack are one transaction, so the entry is never both lost and acknowledged;
        the groups stream is trimmed after. The original bytes are kept as ``field:<name>``.
        """
        log.error(
            "run %s: group entry %s is corrupt, moved to %s: %s", self.run_id, entry_id, self.key, reason
        )
        payload: dict[Any, Any] = {"source_id": entry_id, "group": consumer_group, "reason": reason}
        payload.update({b"field:" + k: v for k, v in fields.items()})
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.key, payload)
            pipe.xack(self.keys.groups, consumer_group, entry_id)
            await pipe.execute()
        await self._streams.trim(self.keys.groups)

    @redis_errors
    async def list(self) -> list[tuple[str, str]]:
        """(original entry id, reason) of every entry that failed to decode."""
        rows = cast(list[Entry], await self.redis.xrange(self.key))
        return [(decode_str(f[b"source_id"]), decode_str(f[b"reason"])) for _, f in rows]
