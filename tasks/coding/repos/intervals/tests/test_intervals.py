import pytest
from intervals import Interval, gaps, merge, total_length


def test_construction_and_length():
    assert Interval(1, 4).length == 3
    assert Interval(2.5, 2.5).length == 0
    assert Interval(-3, 3).length == 6


def test_reversed_bounds_are_rejected():
    with pytest.raises(ValueError):
        Interval(5, 1)


def test_empty():
    assert Interval(3, 3).is_empty()
    assert not Interval(3, 4).is_empty()


def test_contains_is_half_open():
    iv = Interval(1, 5)
    assert iv.contains(1)
    assert iv.contains(4.999)
    assert not iv.contains(5)
    assert not iv.contains(0.5)


def test_overlaps():
    assert Interval(0, 5).overlaps(Interval(4, 8))
    assert Interval(4, 8).overlaps(Interval(0, 5))
    assert Interval(0, 10).overlaps(Interval(2, 3))
    assert not Interval(0, 5).overlaps(Interval(5, 8))
    assert not Interval(6, 8).overlaps(Interval(0, 5))


def test_intersect():
    assert Interval(0, 5).intersect(Interval(3, 9)) == Interval(3, 5)
    assert Interval(3, 9).intersect(Interval(0, 5)) == Interval(3, 5)
    assert Interval(0, 10).intersect(Interval(2, 4)) == Interval(2, 4)
    assert Interval(0, 5).intersect(Interval(5, 9)) is None


def test_shift():
    assert Interval(1, 3).shift(2) == Interval(3, 5)
    assert Interval(1, 3).shift(-1) == Interval(0, 2)


def test_ordering():
    assert Interval(1, 2) < Interval(2, 3)
    assert Interval(1, 2) < Interval(1, 3)
    assert sorted([Interval(5, 6), Interval(0, 9), Interval(0, 1)]) == [
        Interval(0, 1),
        Interval(0, 9),
        Interval(5, 6),
    ]


def test_merge_overlapping():
    assert merge([Interval(1, 3), Interval(2, 6), Interval(8, 10)]) == [Interval(1, 6), Interval(8, 10)]


def test_merge_joins_touching_intervals():
    assert merge([Interval(0, 2), Interval(2, 4)]) == [Interval(0, 4)]


def test_merge_sorts_and_keeps_contained():
    assert merge([Interval(5, 7), Interval(0, 10), Interval(1, 2)]) == [Interval(0, 10)]
    assert merge([Interval(9, 12), Interval(0, 1)]) == [Interval(0, 1), Interval(9, 12)]


def test_merge_drops_empty_intervals():
    assert merge([Interval(3, 3), Interval(1, 2)]) == [Interval(1, 2)]
    assert merge([]) == []


def test_total_length_counts_overlap_once():
    assert total_length([Interval(0, 4), Interval(2, 6)]) == 6
    assert total_length([Interval(0, 1), Interval(5, 7)]) == 3
    assert total_length([]) == 0


def test_gaps():
    found = gaps([Interval(1, 3), Interval(5, 6)], Interval(0, 10))
    assert found == [Interval(0, 1), Interval(3, 5), Interval(6, 10)]


def test_gaps_clipped_to_window():
    assert gaps([Interval(-5, 2), Interval(8, 20)], Interval(0, 10)) == [Interval(2, 8)]
    assert gaps([Interval(0, 10)], Interval(0, 10)) == []
    assert gaps([], Interval(2, 4)) == [Interval(2, 4)]
    assert gaps([Interval(20, 30)], Interval(0, 10)) == [Interval(0, 10)]
