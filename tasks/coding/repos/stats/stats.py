"""Descriptive statistics for lists of numbers."""

import math


def _require(values: list[float], at_least: int = 1) -> None:
    if len(values) < at_least:
        raise ValueError(f"need at least {at_least} value(s), got {len(values)}")


def mean(values: list[float]) -> float:
    _require(values)
    return sum(values) / len(values)


def median(values: list[float]) -> float:
    _require(values)
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def mode(values: list[float]) -> float:
    """The most frequent value; the smallest one among ties."""
    _require(values)
    counts: dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    best = max(counts.values())
    return min(v for v, c in counts.items() if c == best)


def variance(values: list[float], sample: bool = True) -> float:
    """Sample variance (n - 1 in the denominator) by default, else population variance."""
    _require(values, 2 if sample else 1)
    mu = mean(values)
    squares = sum((v - mu) ** 2 for v in values)
    return squares / (len(values) - 1 if sample else len(values))


def stdev(values: list[float], sample: bool = True) -> float:
    return math.sqrt(variance(values, sample))


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (p in 0..100)."""
    _require(values)
    if p < 0 or p > 100:
        raise ValueError("p must be between 0 and 100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def value_range(values: list[float]) -> float:
    _require(values)
    return max(values) - min(values)


def zscores(values: list[float]) -> list[float]:
    """How many population standard deviations each value is from the mean."""
    mu = mean(values)
    sigma = stdev(values, sample=False)
    if sigma == 0:
        raise ValueError("all values are equal")
    return [(v - mu) / sigma for v in values]
