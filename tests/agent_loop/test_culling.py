"""When a group in flight can no longer be trained (pure logic of ``agent_loop.culling``)."""

from __future__ import annotations

import pytest

from agent_loop.culling import GroupWatch


def _watch(oldest: list[int | None]) -> GroupWatch:
    w = GroupWatch(engine=None, size=len(oldest))  # type: ignore[arg-type]
    for tap, v in zip(w.taps, oldest, strict=True):
        tap.oldest = v
    return w


@pytest.mark.parametrize(
    ("oldest", "policy", "hopeless"),
    [
        ([3, 3, 3, 3], 5, True),  # every episode 2 behind, max_staleness 1
        ([3, 3, 3, 3], 4, False),  # 1 behind: trainable
        ([3, 3, 3, 5], 5, True),  # one fresh episode is not a group
        ([3, 3, 5, 5], 5, False),  # two are
        ([3, 3, None, None], 5, False),  # not generated yet: their tokens will be fresh
        ([3, 3, 3, None], 5, True),
        ([None, None], 9, False),
    ],
)
def test_a_group_is_hopeless_when_fewer_than_two_episodes_could_be_trained(oldest, policy, hopeless):
    assert _watch(oldest).hopeless(policy, max_staleness=1) is hopeless
