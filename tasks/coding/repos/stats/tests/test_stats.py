import math

import pytest
from stats import mean, median, mode, percentile, stdev, value_range, variance, zscores


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5
    assert mean([5]) == 5
    assert mean([-2, 2]) == 0


def test_empty_input_is_rejected():
    for fn in (mean, median, mode, value_range):
        with pytest.raises(ValueError):
            fn([])


def test_median_odd_and_even():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
    assert median([7]) == 7
    assert median([1, 1, 5, 9]) == 3


def test_mode():
    assert mode([1, 2, 2, 3]) == 2
    assert mode([4, 4, 1, 1, 3]) == 1
    assert mode([9]) == 9


def test_variance_sample_and_population():
    data = [2, 4, 4, 4, 5, 5, 7, 9]
    assert variance(data, sample=False) == 4
    assert variance(data) == pytest.approx(32 / 7)
    assert variance([1, 1, 1]) == 0


def test_variance_needs_enough_values():
    with pytest.raises(ValueError):
        variance([1])
    assert variance([1], sample=False) == 0


def test_stdev():
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == 2
    assert stdev([1, 3]) == pytest.approx(math.sqrt(2))


def test_percentile_endpoints_and_middle():
    data = [15, 20, 35, 40, 50]
    assert percentile(data, 0) == 15
    assert percentile(data, 100) == 50
    assert percentile(data, 50) == 35


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20, 30, 40, 50], 30) == 22
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90) == pytest.approx(9.1)
    assert percentile([4], 75) == 4


def test_percentile_rejects_bad_p():
    for bad in (-1, 101):
        with pytest.raises(ValueError):
            percentile([1, 2], bad)


def test_value_range():
    assert value_range([3, 9, -1]) == 10
    assert value_range([2]) == 0


def test_zscores():
    assert zscores([2, 4, 4, 4, 5, 5, 7, 9]) == [-1.5, -0.5, -0.5, -0.5, 0, 0, 1, 2]
    with pytest.raises(ValueError):
        zscores([3, 3, 3])
