"""The staleness rule at its boundary."""

from __future__ import annotations

from pqrl.staleness import MIN_GROUP_EPISODES, within_staleness


def test_a_token_trains_up_to_max_staleness_versions_behind_and_not_one_more():
    assert within_staleness(3, 4, 1) and within_staleness(5, 5, 0)
    assert not within_staleness(3, 5, 1) and not within_staleness(4, 5, 0)
    assert MIN_GROUP_EPISODES == 2  # a group-relative advantage compares an episode with another
