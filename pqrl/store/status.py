"""The job's latest figures for ``pqrl status``: a hash of JSON-encoded values."""

from __future__ import annotations

import json
from typing import Any

from pqrl.store.connection import RunPart, decode_str, redis_errors

__all__ = ["JobStatus"]


class JobStatus(RunPart):
    """The hash ``keys.status``."""

    @redis_errors
    async def set(self, fields: dict[str, Any]) -> None:
        """Records the trainer's latest figures (values JSON-encoded); other fields are kept."""
        await self.redis.hset(self.keys.status, mapping={k: json.dumps(v) for k, v in fields.items()})

    @redis_errors
    async def get(self) -> dict[str, Any]:
        """Every field recorded so far, decoded."""
        raw = await self.redis.hgetall(self.keys.status)
        return {decode_str(k): json.loads(v) for k, v in raw.items()}
