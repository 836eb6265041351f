import pytest
from lru import LRUCache


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_put_and_get():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    assert cache.get("b") == 2
    assert cache.get("c") is None
    assert cache.get("c", 7) == 7
    assert len(cache) == 2


def test_least_recently_used_is_evicted():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert "a" not in cache
    assert cache.keys() == ["b", "c"]
    assert cache.evictions == 1


def test_get_refreshes_recency():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.get("a")
    cache.put("c", 3)
    assert cache.keys() == ["a", "c"]


def test_put_existing_key_updates_and_refreshes():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert cache.get("a") == 10
    assert "b" not in cache
    assert len(cache) == 2


def test_contains_does_not_refresh():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert "a" in cache
    cache.put("c", 3)
    assert "a" not in cache


def test_hit_and_miss_counters():
    cache = LRUCache(3)
    assert cache.hit_rate() == 0.0
    cache.put(1, "one")
    cache.get(1)
    cache.get(1)
    cache.get(2)
    assert (cache.hits, cache.misses) == (2, 1)
    assert cache.hit_rate() == pytest.approx(2 / 3)


def test_pop():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.pop("a") == 1
    assert cache.pop("a", "gone") == "gone"
    assert len(cache) == 0


def test_resize_evicts_oldest():
    cache = LRUCache(4)
    for key in "abcd":
        cache.put(key, key.upper())
    cache.resize(2)
    assert cache.keys() == ["c", "d"]
    assert cache.evictions == 2
    with pytest.raises(ValueError):
        cache.resize(0)


def test_resize_larger_keeps_everything():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.resize(3)
    cache.put("c", 3)
    assert cache.keys() == ["a", "b", "c"]
    assert cache.evictions == 0


def test_clear():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.clear()
    assert len(cache) == 0
    assert cache.get("a") is None


def test_capacity_one():
    cache = LRUCache(1)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.keys() == ["b"]
    assert cache.get("a") is None
    assert cache.get("b") == 2


def test_falsy_values_are_cached():
    cache = LRUCache(2)
    cache.put("zero", 0)
    cache.put("none", None)
    assert cache.get("zero", "missing") == 0
    assert cache.get("none", "missing") is None
    assert cache.hits == 2
