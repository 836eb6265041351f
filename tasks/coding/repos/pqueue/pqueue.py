"""A binary-heap priority queue: the smallest priority first, first-in first-out among equals."""


class Empty(Exception):
    pass


class PriorityQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, object]] = []
        self._counter = 0

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return len(self._heap) > 0

    def push(self, item: object, priority: float) -> None:
        self._heap.append((priority, self._counter, item))
        self._counter += 1
        self._sift_up(len(self._heap) - 1)

    def peek(self) -> object:
        if not self._heap:
            raise Empty("peek from an empty queue")
        return self._heap[0][2]

    def pop(self) -> object:
        if not self._heap:
            raise Empty("pop from an empty queue")
        last = self._heap.pop()
        if not self._heap:
            return last[2]
        top = self._heap[0]
        self._heap[0] = last
        self._sift_down(0)
        return top[2]

    def pop_all(self) -> list:
        """Every item in priority order; the queue is empty afterwards."""
        items = []
        while self._heap:
            items.append(self.pop())
        return items

    def push_many(self, pairs: list[tuple[object, float]]) -> None:
        for item, priority in pairs:
            self.push(item, priority)

    def _sift_up(self, index: int) -> None:
        heap = self._heap
        while index > 0:
            parent = (index - 1) // 2
            if heap[index] < heap[parent]:
                heap[index], heap[parent] = heap[parent], heap[index]
                index = parent
            else:
                break

    def _sift_down(self, index: int) -> None:
        heap = self._heap
        size = len(heap)
        while True:
            left = 2 * index + 1
            right = left + 1
            smallest = index
            if left < size and heap[left] < heap[smallest]:
                smallest = left
            if right < size and heap[right] < heap[smallest]:
                smallest = right
            if smallest == index:
                return
            heap[index], heap[smallest] = heap[smallest], heap[index]
            index = smallest
