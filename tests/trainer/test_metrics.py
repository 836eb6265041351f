"""The per-step rollout figures: reward shape and where an episode's time went."""

from __future__ import annotations

import dataclasses

import pytest

from pqrl.trajectory import Status
from tests.conftest import make_trajectory
from trainer.metrics import rollout_metrics


def test_rollout_metrics_reward_shape_and_episode_phases():
    phases = {"generate_s": 1.0, "open_s": 0.2, "tools_s": 0.5, "grade_s": 2.0, "total_s": 3.7}
    rewards = (0.0, 0.0, 0.5, 1.0)
    group = [dataclasses.replace(make_trajectory(index=i, reward=r), timings=dict(phases, tools_s=0.5 * i))
             for i, r in enumerate(rewards)]  # fmt: skip
    failed = dataclasses.replace(make_trajectory(index=9, reward=1.0), status=Status.FAILED_INFRA)
    m = rollout_metrics([group + [failed]])
    assert m["rollout/failed_infra_frac"] == pytest.approx(1 / 5)
    assert m["rollout/reward_zero_frac"] == 0.5 and m["rollout/pass_rate"] == 0.25  # infra failures left out
    assert m["time/episode_grade_s"] == 2.0 and m["time/episode_tools_s"] == pytest.approx(0.75)
    assert "time/episode_open_s" in m and m["rollout/tool_calls"] == 1.0
