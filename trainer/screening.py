"""Which trajectories a training step trains on, and the rewards its advantages see.

A trajectory is left out, and counted, when its infrastructure failed, when its oldest generated
token is more than ``max_staleness`` versions behind the step's (``pqrl.staleness``), or, with
``filter_truncated``, when it ended at a token limit. A group is left out when fewer than
``MIN_GROUP_EPISODES`` of its members remain, or when their (shaped) rewards are all equal: then
every group-relative advantage is 0 (DAPO's dynamic sampling), though a batch-mean baseline or a
critic still gives it a signal. The trained reward is the verifier's plus DAPO's overlong penalty
(``overlong_buffer``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from pqrl.shaping import overlong_penalty
from pqrl.staleness import MIN_GROUP_EPISODES, within_staleness
from pqrl.trajectory import Status, Trajectory
from trainer.config import StepConfig

__all__ = [
    "Screened",
    "drop_reason",
    "ended_at_a_limit",
    "screen_group",
    "select_trajectories",
    "trained_reward",
]


def ended_at_a_limit(t: Trajectory) -> bool:
    """The episode hit the token budget, or its last turn was cut at the turn's token limit."""
    return t.status is Status.TRUNCATED or bool(t.turns and t.turns[-1].finish_reason == "length")


def trained_reward(t: Trajectory, cfg: StepConfig) -> float:
    """The reward the advantages see: the verifier's (already shaped by the task's own grader), plus
    DAPO's overlong penalty when it is on."""
    alg = cfg.algorithm
    if not alg.overlong_buffer or alg.context_tokens is None:
        return t.reward
    return t.reward + overlong_penalty(
        t.num_tokens, alg.context_tokens, alg.overlong_buffer, alg.overlong_penalty
    )


def _oldest(t: Trajectory) -> int:
    return int(t.versions[t.generated.astype(bool)].min())


def drop_reason(t: Trajectory, version: int, cfg: StepConfig) -> str | None:
    """Why the step at ``version`` leaves ``t`` out on its own (``failed_infra``, ``stale``,
    ``truncated``); None: it is trainable (its group may still be dropped)."""
    if t.status is Status.FAILED_INFRA or t.num_generated == 0:
        return "failed_infra"
    if not within_staleness(_oldest(t), version, cfg.max_staleness):
        return "stale"
    if cfg.algorithm.filter_truncated and ended_at_a_limit(t):
        return "truncated"
    return None


@dataclasses.dataclass(frozen=True)
class Screened:
    """One group as the step sees it: its trainable members and their trained rewards, why the whole
    group is dropped (None: it is used), the counts of dropped members, and the staleness (versions
    behind the current one) of every scored member."""

    valid: list[Trajectory]
    rewards: list[float]
    dropped: str | None
    counts: Counter[str]
    ages: list[int]


def screen_group(group: Sequence[Trajectory], version: int, cfg: StepConfig) -> Screened:
    """Which members of ``group`` the step at ``version`` trains on, and whether the group is used."""
    counts: Counter[str] = Counter()
    ages: list[int] = []
    valid = []
    for t in group:
        reason = drop_reason(t, version, cfg)
        if reason != "failed_infra":
            ages.append(version - _oldest(t))
        if reason is not None:
            counts[f"dropped/{reason}"] += 1
            continue
        valid.append(t)
    rewards = [trained_reward(t, cfg) for t in valid]
    dropped = None
    if len(valid) < MIN_GROUP_EPISODES:
        dropped = "groups_too_few_valid"
    # every group-relative advantage would be 0 (DAPO dynamic sampling); a batch-mean baseline or
    # a critic still gives such a group a signal
    elif cfg.algorithm.advantage not in ("reinforce_baseline", "ppo") and len(set(rewards)) == 1:
        dropped = "no_signal_groups"
    return Screened(valid, rewards, dropped, counts, ages)


def select_trajectories(
    groups: Sequence[Sequence[Trajectory]], version: int, cfg: StepConfig
) -> tuple[list[Trajectory], list[float], list[int], dict[str, float]]:
    """The usable trajectories, their shaped rewards and group indices, and the counts of what was dropped."""
    counts: Counter[str] = Counter()
    staleness: Counter[int] = Counter()
    used: list[Trajectory] = []
    rewards: list[float] = []
    group_ids: list[int] = []
    for g, group in enumerate(groups):
        screened = screen_group(group, version, cfg)
        counts.update(screened.counts)
        staleness.update(screened.ages)
        if screened.dropped is not None:
            counts[f"dropped/{screened.dropped}"] += 1
            continue
        used += screened.valid
        rewards += screened.rewards
        group_ids += [g] * len(screened.valid)
    metrics: dict[str, float] = {k: float(v) for k, v in counts.items()}
    metrics |= {f"offpolicy/staleness_{k}": float(v) for k, v in sorted(staleness.items())}
    metrics["rollout/trajectories_used"] = float(len(used))
    if used and cfg.algorithm.overlong_buffer:
        metrics["rewards/overlong_penalty_mean"] = sum(
            r - t.reward for r, t in zip(rewards, used, strict=True)
        ) / len(used)
    return used, rewards, group_ids, metrics
