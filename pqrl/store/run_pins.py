"""The run's pins: what every process of a run must share (sampling, group shape, model, task plan),
pinned by the first process that joins the run so a worker started from another config cannot slip
in."""

from __future__ import annotations

import json
from typing import Any

from pqrl.store.connection import RunPart, redis_errors

__all__ = ["RunPins", "differences"]


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


class RunPins(RunPart):
    """The string ``keys.pins``: the run's pinned values as JSON."""

    @redis_errors
    async def agree(self, ours: dict[str, Any], *, replace: bool = False) -> dict[str, tuple[Any, Any]]:
        """Pins ``ours`` if the run has no pins yet (or ``replace``), else compares them with the pins.

        Returns the differences (empty when they agree). JSON round-trips ``ours`` first, so tuples and
        lists compare equal.
        """
        ours = json.loads(json.dumps(ours, sort_keys=True))
        blob = json.dumps(ours, sort_keys=True)
        if replace:
            await self.redis.set(self.keys.pins, blob)
            return {}
        if await self.redis.set(self.keys.pins, blob, nx=True):
            return {}
        stored = await self.redis.get(self.keys.pins)
        return differences(json.loads(stored), ours) if stored is not None else {}

    @redis_errors
    async def get(self) -> dict[str, Any] | None:
        raw = await self.redis.get(self.keys.pins)
        return json.loads(raw) if raw is not None else None
