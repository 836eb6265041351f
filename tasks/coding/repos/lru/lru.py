"""A least-recently-used cache with hit/miss counters and resizing."""

from collections import OrderedDict


class LRUCache:
    """Holds at most ``capacity`` entries; adding one more evicts the least recently used."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._data: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        """Membership does not count as a use."""
        return key in self._data

    def get(self, key, default=None):
        """The value of ``key`` (now the most recently used), or ``default``."""
        if key not in self._data:
            self.misses += 1
            return default
        self.hits += 1
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key, value) -> None:
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        self._shrink()

    def pop(self, key, default=None):
        return self._data.pop(key, default)

    def keys(self) -> list:
        """Keys from least to most recently used."""
        return list(self._data)

    def resize(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._shrink()

    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def clear(self) -> None:
        self._data.clear()

    def _shrink(self) -> None:
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)
            self.evictions += 1
