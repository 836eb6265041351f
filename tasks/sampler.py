"""The task sampler's schedule: which task the k-th claim of a run gets (pure and deterministic).

A run samples from several suites. Given the suites (id, number of tasks, mixing weight), an epoch
count and a seed, ``Schedule.slot(k)`` names the k-th task handed out overall, so the whole position
of the sampler is one integer ``k``: saved in Redis (tasks.storage) and in trainer checkpoints.

Mixing is stride scheduling with the Sainte-Laguë divisor sequence: draw ``j = 0, 1, ...`` of suite
``i`` sits at virtual time ``(j + 1/2) / w_i`` and draws are handed out in order of virtual time,
ties to the suite listed first. After any prefix every suite still in play has had its weighted
share of the draws to within one, and the interleaving depends on the config alone. Weights are
compared as exact rationals of their decimal text (0.1 and 0.2 are exactly 1:2).

Epochs are counted per suite: draw ``j`` of a suite of ``n`` tasks is in epoch ``j // n`` and takes
task ``perm_e[j % n]``, where ``perm_e`` is a seeded permutation of the suite drawn anew each epoch.
With ``epochs=E`` a suite has ``E * n`` draws and then drops out; the others go on at their relative
weights. Weights therefore set the rate and epochs the amount: a small, heavily weighted suite
finishes its epochs first, and the schedule ends after exactly ``E * sum(n_i)`` slots.
``epochs=None`` never ends.

Skipping tasks without signal (``skip_flat``, off by default): a group whose rewards are all equal
teaches GRPO nothing, and a task solved always or never by the current policy gives such groups
again. With ``skip_flat = s`` a task whose last group carried no signal gives up its next ``s``
draws (the slot passes without a group) and then runs again, so a task the policy has mastered costs
one group in ``s + 1`` draws, and one it newly learns or forgets is seen again within ``s`` epochs.
The schedule itself stays fixed: skipping only decides, per slot, whether the slot's task runs
(``skips``), from the outcomes the rollout managers record.

Deliberately left out: weights that change during a run (they re-time every later slot; configure a
new run instead) and sampling with replacement.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

__all__ = ["SamplerConfig", "Schedule", "Slot", "SuiteShare", "permutation", "skips"]


@dataclass(frozen=True)
class SuiteShare:
    """One suite of the mix: its id (``name@digest``), its number of tasks and its weight."""

    suite_id: str
    n_tasks: int
    weight: float = 1.0


@dataclass(frozen=True)
class SamplerConfig:
    """What the schedule of a run is made of; stored with the run so every manager agrees."""

    suites: tuple[SuiteShare, ...]
    epochs: int | None = None
    seed: int = 0
    skip_flat: int = 0

    def __post_init__(self) -> None:
        if not self.suites:
            raise ValueError("a sampler needs at least one suite")
        ids = [s.suite_id for s in self.suites]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a suite appears twice in the sampler: {ids}")
        for s in self.suites:
            if s.n_tasks < 1:
                raise ValueError(f"suite {s.suite_id} has {s.n_tasks} tasks")
            if not (math.isfinite(s.weight) and s.weight > 0):
                raise ValueError(f"suite {s.suite_id}: weight must be finite and > 0, got {s.weight}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs must be >= 1 or None, got {self.epochs}")
        if self.skip_flat < 0:
            raise ValueError(f"skip_flat must be >= 0, got {self.skip_flat}")

    def to_json(self) -> str:
        """Canonical text: the same config always gives the same string (compared in Redis)."""
        suites = [[s.suite_id, s.n_tasks, s.weight] for s in self.suites]
        d: dict[str, Any] = {"suites": suites, "epochs": self.epochs, "seed": self.seed}
        if self.skip_flat:  # absent when off: a run configured before skipping existed reads the same
            d["skip_flat"] = self.skip_flat
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> SamplerConfig:
        d: dict[str, Any] = json.loads(text)
        suites = tuple(SuiteShare(str(i), int(n), float(w)) for i, n, w in d["suites"])
        return cls(suites, d["epochs"], int(d["seed"]), int(d.get("skip_flat", 0)))


def skips(flat: int, skipped: int, skip_flat: int) -> bool:
    """Whether a task gives up its slot: its last group had no signal (``flat`` > 0) and it has
    given up fewer than ``skip_flat`` draws since it last ran."""
    return flat > 0 and skipped < skip_flat


class Slot(NamedTuple):
    suite_id: str
    task_index: int
    epoch: int


@functools.lru_cache(maxsize=32)  # a run walks each suite one epoch at a time: a few live entries
def permutation(seed: int, suite_id: str, epoch: int, n: int) -> tuple[int, ...]:
    """The order of a suite's tasks in one epoch: sorted by a keyed hash, so stable across Python
    and numpy versions (a resumed run on another machine must draw the same order)."""
    salt = f"{seed}:{suite_id}:{epoch}:".encode()
    return tuple(
        sorted(range(n), key=lambda t: hashlib.blake2b(salt + str(t).encode(), digest_size=8).digest())
    )


class Schedule:
    """``slot(k)`` for every ``k`` below ``total`` (``None``: endless); see the module docstring."""

    def __init__(self, config: SamplerConfig) -> None:
        self.config = config
        self.suites = config.suites
        # Integer weights with the same ratios, so every comparison below is exact.
        fracs = [Fraction(str(s.weight)) for s in self.suites]
        scale = math.lcm(*(f.denominator for f in fracs))
        ints = [int(f * scale) for f in fracs]
        g = math.gcd(*ints)
        self._w = [a // g for a in ints]
        e = config.epochs
        self._cap: list[int | None] = [None if e is None else e * s.n_tasks for s in self.suites]
        self.total: int | None = None if e is None else sum(e * s.n_tasks for s in self.suites)

    def __len__(self) -> int:
        if self.total is None:
            raise TypeError("an endless schedule (epochs=None) has no length")
        return self.total

    def exhausted(self, k: int) -> bool:
        return self.total is not None and k >= self.total

    def slot(self, k: int) -> Slot:
        """The k-th task handed out overall (0-based). Raises IndexError past the end."""
        if k < 0 or self.exhausted(k):
            raise IndexError(f"slot {k} is outside the schedule (length {self.total})")
        for i, s in enumerate(self.suites):
            # Draw (i, j) has rank >= j, so slot k is one of the first k + 1 draws of its suite.
            cap = self._cap[i]
            hi = k + 1 if cap is None else min(k + 1, cap)
            j = bisect.bisect_left(range(hi), k, key=lambda j, i=i: self._rank(i, j))
            if j < hi and self._rank(i, j) == k:
                epoch, pos = divmod(j, s.n_tasks)
                return Slot(
                    s.suite_id, permutation(self.config.seed, s.suite_id, epoch, s.n_tasks)[pos], epoch
                )
        raise AssertionError(f"no draw has rank {k}")  # ranks are a bijection onto [0, total)

    def _rank(self, i: int, j: int) -> int:
        """How many draws come before draw j of suite i: those with an earlier virtual time, and
        those at the same time from suites listed before i."""
        rank = j
        for m, a_m in enumerate(self._w):
            if m == i:
                continue
            # Draw j' of suite m is before iff (2j'+1) / a_m < (2j+1) / a_i, i.e. (2j'+1) a_i < N.
            n = (2 * j + 1) * a_m
            a_i = self._w[i]
            count = (n // a_i + 1) // 2 if m < i else ((n - 1) // a_i + 1) // 2
            cap = self._cap[m]
            rank += count if cap is None else min(count, cap)
        return rank
