"""Which samples the trainer can use, stated once for everything that decides by it.

An episode trains if its oldest generated token is within ``max_staleness`` versions of the policy
that trains on it; a group trains only with at least ``MIN_GROUP_EPISODES`` usable episodes (a
group-relative advantage compares each episode with the others of its group). The trainer's
screening applies it to arrived groups, the rollout manager's culling to groups still generating,
and the staleness gate's admission budget is this rule for a group's first token (the gate's tests
check its Lua against ``within_staleness``).
"""

from __future__ import annotations

__all__ = ["MIN_GROUP_EPISODES", "within_staleness"]

MIN_GROUP_EPISODES = 2


def within_staleness(oldest: int, version: int, max_staleness: int) -> bool:
    """A token of weight version ``oldest`` may train the policy at ``version``."""
    return version - oldest <= max_staleness
