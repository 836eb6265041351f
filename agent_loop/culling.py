"""Which groups in flight can no longer be trained: the trainer drops an episode whose oldest token is
more than ``max_staleness`` versions behind its policy, and a group with fewer than
``MIN_GROUP_EPISODES`` episodes left (both in ``pqrl.staleness``). A group admitted within the
staleness budget can still fall that far behind while a slow episode (a slow tool, a long turn)
keeps it open. Generating the rest of it wastes the engine's time and holds a place in the staleness
gate that a fresh group could use, so the manager cancels it.

``VersionTap`` sits between one episode and the engine and notes the oldest weight version of the
tokens it got back; ``GroupWatch`` holds a group's taps and says when the group is hopeless. The
rule is exact, never early: an episode counts as stale only once it holds a token the trainer would
find too old, and the policy version only grows.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.protocol import Engine, Generation, SamplingParams
from pqrl.staleness import MIN_GROUP_EPISODES, within_staleness

__all__ = ["GroupWatch", "VersionTap"]


class VersionTap(Engine):
    """An ``Engine`` that passes calls through and remembers the oldest weight version it returned."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.oldest: int | None = None  # None: no token yet

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        *,
        rollout_id: str | None = None,
    ) -> Generation:
        gen = await self.engine.generate(input_ids, sampling_params, rollout_id=rollout_id)
        if gen.versions:
            low = min(gen.versions)
            self.oldest = low if self.oldest is None else min(self.oldest, low)
        return gen

    def release(self, rollout_id: str) -> None:
        self.engine.release(rollout_id)


class GroupWatch:
    """The taps of one group's episodes."""

    def __init__(self, engine: Engine, size: int) -> None:
        self.taps = [VersionTap(engine) for _ in range(size)]
        self.culled = False

    def hopeless(self, policy_version: int, max_staleness: int) -> bool:
        """True when fewer than ``MIN_GROUP_EPISODES`` episodes could still be trained at
        ``policy_version`` or later."""
        trainable = sum(
            t.oldest is None or within_staleness(t.oldest, policy_version, max_staleness) for t in self.taps
        )
        return trainable < MIN_GROUP_EPISODES
