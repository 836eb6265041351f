import pytest
from pqueue import Empty, PriorityQueue


def test_empty_queue():
    q = PriorityQueue()
    assert len(q) == 0
    assert not q
    with pytest.raises(Empty):
        q.pop()
    with pytest.raises(Empty):
        q.peek()


def test_single_item():
    q = PriorityQueue()
    q.push("only", 5)
    assert len(q) == 1
    assert q
    assert q.peek() == "only"
    assert q.pop() == "only"
    assert not q


def test_smallest_priority_first():
    q = PriorityQueue()
    q.push("c", 3)
    q.push("a", 1)
    q.push("b", 2)
    assert q.pop() == "a"
    assert q.pop() == "b"
    assert q.pop() == "c"


def test_peek_does_not_remove():
    q = PriorityQueue()
    q.push("x", 2)
    q.push("y", 1)
    assert q.peek() == "y"
    assert len(q) == 2


def test_ties_are_first_in_first_out():
    q = PriorityQueue()
    for name in ["first", "second", "third", "fourth"]:
        q.push(name, 7)
    assert q.pop_all() == ["first", "second", "third", "fourth"]


def test_many_items_come_out_sorted():
    q = PriorityQueue()
    priorities = [(i * 37) % 101 for i in range(101)]
    for p in priorities:
        q.push(p, p)
    assert q.pop_all() == sorted(priorities)


def test_interleaved_push_and_pop():
    q = PriorityQueue()
    q.push("e", 5)
    q.push("b", 2)
    assert q.pop() == "b"
    q.push("a", 1)
    q.push("d", 4)
    assert q.pop() == "a"
    q.push("c", 3)
    assert q.pop_all() == ["c", "d", "e"]


def test_negative_and_float_priorities():
    q = PriorityQueue()
    q.push_many([("zero", 0), ("minus", -1.5), ("plus", 0.5)])
    assert q.pop_all() == ["minus", "zero", "plus"]


def test_items_need_not_be_comparable():
    q = PriorityQueue()
    q.push({"job": 1}, 1)
    q.push({"job": 2}, 1)
    assert q.pop() == {"job": 1}


def test_pop_all_empties_queue():
    q = PriorityQueue()
    q.push_many([("a", 3), ("b", 1)])
    assert q.pop_all() == ["b", "a"]
    assert len(q) == 0
    assert q.pop_all() == []


def test_ties_stay_fifo_among_other_priorities():
    q = PriorityQueue()
    q.push_many([("low1", 9), ("high1", 1), ("low2", 9), ("high2", 1), ("mid", 5), ("low3", 9)])
    assert q.pop_all() == ["high1", "high2", "mid", "low1", "low2", "low3"]
