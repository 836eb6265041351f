"""Reward shaping: pure functions of plain numbers, used by the trainer and by task reward terms.

- ``overlong_penalty``: DAPO's soft overlong punishment, so an episode that runs into the token
  budget is told so by a graded penalty instead of a cliff;
- ``kl_penalized``: the KL to the reference policy as a reward penalty (the InstructGPT form)
  instead of a loss term.
"""

from __future__ import annotations

__all__ = ["kl_penalized", "overlong_penalty"]


def overlong_penalty(length: int, budget: int, buffer: int, penalty: float = 1.0) -> float:
    """0 up to ``budget - buffer`` tokens, then linearly down to ``-penalty`` at ``budget`` (and beyond).

    >>> overlong_penalty(768, 1024, 256), overlong_penalty(896, 1024, 256), overlong_penalty(1100, 1024, 256)
    (0.0, -0.5, -1.0)
    """
    start = budget - buffer
    if buffer <= 0 or length <= start:
        return 0.0
    return -penalty * min((length - start) / buffer, 1.0)


def kl_penalized(reward: float, kl_sum: float, coef: float) -> float:
    """``r - coef * sum_t KL_t``: the sequence's summed per-token KL estimate, charged to its reward."""
    return reward - coef * kl_sum
