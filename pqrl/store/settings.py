"""The settings every process of a run must share (sampling, group shape, model, task plan), fixed
by the first process that joins the run so a worker started from another config cannot slip in."""

from __future__ import annotations

import json
from typing import Any

from pqrl.store.connection import RunPart, redis_errors

__all__ = ["RunSettings", "differences"]


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out |= _flat(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def differences(run: dict[str, Any], ours: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Dotted field -> (the run's value, ours) for every leaf that differs or exists on one side only."""
    a, b = _flat(run), _flat(ours)
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


class RunSettings(RunPart):
    """The string ``keys.settings``: the run's shared settings as JSON."""

    @redis_errors
    async def agree(self, ours: dict[str, Any], *, replace: bool = False) -> dict[str, tuple[Any, Any]]:
        """Sets the run's settings to ``ours`` if it has none (or ``replace``), else compares.

        Returns the differences (empty when they agree). JSON round-trips ``ours`` first, so tuples and
        lists compare equal.
        """
        ours = json.loads(json.dumps(ours, sort_keys=True))
        blob = json.dumps(ours, sort_keys=True)
        if replace:
            await self.redis.set(self.keys.settings, blob)
            return {}
        if await self.redis.set(self.keys.settings, blob, nx=True):
            return {}
        stored = await self.redis.get(self.keys.settings)
        return differences(json.loads(stored), ours) if stored is not None else {}

    @redis_errors
    async def get(self) -> dict[str, Any] | None:
        raw = await self.redis.get(self.keys.settings)
        return json.loads(raw) if raw is not None else None
