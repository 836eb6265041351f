"""Half-open intervals [lo, hi) of numbers: overlap, intersection, merging and gaps."""

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    """The numbers x with lo <= x < hi. An interval with lo == hi is empty."""

    lo: float
    hi: float

    def __post_init__(self) -> None:
        if self.hi < self.lo:
            raise ValueError(f"interval end {self.hi} is before its start {self.lo}")

    @property
    def length(self) -> float:
        return self.hi - self.lo

    def is_empty(self) -> bool:
        return self.lo == self.hi

    def contains(self, x: float) -> bool:
        return self.lo <= x < self.hi

    def overlaps(self, other: "Interval") -> bool:
        """True when the two intervals share at least one number."""
        return self.lo < other.hi and other.lo < self.hi

    def intersect(self, other: "Interval") -> "Interval | None":
        """The common part, or None when there is none."""
        if not self.overlaps(other):
            return None
        return Interval(max(self.lo, other.lo), min(self.hi, other.hi))

    def shift(self, offset: float) -> "Interval":
        return Interval(self.lo + offset, self.hi + offset)


def merge(intervals: list[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same numbers; touching intervals are joined."""
    result: list[Interval] = []
    for item in sorted(intervals):
        if item.is_empty():
            continue
        if result and item.lo <= result[-1].hi:
            last = result.pop()
            result.append(Interval(last.lo, max(last.hi, item.hi)))
        else:
            result.append(item)
    return result


def total_length(intervals: list[Interval]) -> float:
    """The length of the union of ``intervals``."""
    return sum(item.length for item in merge(intervals))


def gaps(intervals: list[Interval], within: Interval) -> list[Interval]:
    """The parts of ``within`` that no interval covers, in order."""
    result = []
    start = within.lo
    for item in merge(intervals):
        if item.hi <= within.lo or item.lo >= within.hi:
            continue
        if item.lo > start:
            result.append(Interval(start, item.lo))
        start = max(start, item.hi)
    if start < within.hi:
        result.append(Interval(start, within.hi))
    return result
