"""The trainer's outer step: read groups from the store, train, publish the new weights.

One ``TrainerLoop.step()``:

1. reads ``groups_per_step`` finished groups through the ``trainer`` consumer group;
2. runs ``trainer.step.train_step`` on them at the current policy version (in a thread, so the
   event loop keeps serving Redis); groups it drops (stale, no signal) are reported to the
   staleness gate with ``gate_reject``, so they free their places;
3. saves the weights in Hugging Face format, asks every engine to load them with the next
   version (``/update_weights_from_disk``, aborting in-flight requests so per-token versions stay
   exact), and only then publishes that version in Redis;
4. acknowledges the groups (which trims them from the stream).

Deliberately left out (issue #7): checkpoints with optimizer state and resume, acknowledging only
after a checkpoint, the NCCL weight path, evaluation, metrics files, and ``pqrl train``.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pqrl.engine_client import EngineClient
from pqrl.store import GroupEntry, TrajectoryStore
from trainer.step import StepConfig, train_step

__all__ = ["LoopConfig", "TrainerLoop"]


@dataclass(frozen=True)
class LoopConfig:
    groups_per_step: int = 4
    weights_dir: str = "runs/weights"
    keep_weights: int = 2  # published weight directories kept on disk
    consumer: str = "trainer-0"
    read_block_ms: int = 1000
    step: StepConfig = field(default_factory=StepConfig)


class TrainerLoop:
    """Consumes groups and publishes weights for one run."""

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        store: TrajectoryStore,
        engine: EngineClient | None,
        cfg: LoopConfig | None = None,
        *,
        tokenizer: Any = None,
    ) -> None:
        self.model, self.optimizer, self.store, self.engine = model, optimizer, store, engine
        self.tokenizer = tokenizer
        self.cfg = cfg or LoopConfig()
        self._published: list[Path] = []

    async def step(self, *, timeout_s: float | None = None) -> dict[str, float]:
        """One step; returns its metrics (with ``policy/version`` after publication)."""
        await self.store.create_consumer_group("trainer")
        entries = await self._read(timeout_s)
        version = (await self.store.get_policy()).version
        groups = [e.trajectories for e in entries]
        metrics = await asyncio.to_thread(
            train_step, self.model, self.optimizer, groups, version, self.cfg.step
        )
        dropped = int(
            metrics.get("dropped/groups_too_few_valid", 0) + metrics.get("dropped/no_signal_groups", 0)
        )
        if dropped:
            await self.store.gate_reject(dropped)
        if metrics.get("rollout/trajectories_used", 0) > 0:
            metrics["policy/version"] = float(await self._publish(version + 1))
        else:
            metrics["policy/version"] = float(version)
        await self.store.ack("trainer", [e.entry_id for e in entries])
        return metrics

    async def _read(self, timeout_s: float | None) -> list[GroupEntry]:
        entries: list[GroupEntry] = []
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while len(entries) < self.cfg.groups_per_step:
            if deadline is not None and loop.time() > deadline:
                raise TimeoutError(f"only {len(entries)} of {self.cfg.groups_per_step} groups arrived")
            missing = self.cfg.groups_per_step - len(entries)
            entries += await self.store.read_groups(
                "trainer", self.cfg.consumer, count=missing, block_ms=self.cfg.read_block_ms
            )
        return entries

    async def _publish(self, version: int) -> int:
        path = Path(self.cfg.weights_dir) / f"v{version}"
        await asyncio.to_thread(self._save, path)
        if self.engine is not None:  # engines first: a published version is one engines serve
            await self.engine.update_weights_from_disk(str(path), version)
        published = await self.store.publish_policy(str(path.resolve()), version=version)
        self._published.append(path)
        while len(self._published) > self.cfg.keep_weights:
            shutil.rmtree(self._published.pop(0), ignore_errors=True)
        return published

    def _save(self, path: Path) -> None:
        self.model.save_pretrained(path)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(path)
