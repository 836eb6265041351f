"""The built-in engine's prefix cache: the KV of recently computed token sequences, for later prompts
that start the same way.

Why: in agentic RL most prompt tokens were computed before. A GRPO group sends the same prompt G
times; every task of a suite starts with the same instructions and worked examples; and each turn
of an episode resends the whole conversation so far. Without a cache each of these is prefilled from
scratch, and on a CPU the prefill is most of the generation time (16 prompts of 450 tokens: 23 s of
prefill against 8 s for 48 decode steps of the same rows).

A prompt reuses the KV of the longest common prefix it has with any entry: keys and values depend
only on the tokens at and before their position, so the first ``n`` columns of an entry are valid
for any sequence whose first ``n`` tokens are the same. The entries are whole sequences (a prompt
after its prefill, a prompt plus its response when the request finishes), each holding its own
copy of the KV, evicted least recently used first past ``max_tokens``. An entry that is a prefix of
a newer one is dropped: the newer one covers it.

The cache knows nothing of weights: the engine flushes it when they change, so a hit always
reproduces what a fresh prefill would compute (up to the float noise of different batch shapes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["KV", "PrefixCache", "common_prefix_len"]

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [heads, tokens, head_dim]


def common_prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:
    """The number of leading tokens two 1-D token tensors share."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else n


@dataclass(eq=False)
class _Entry:
    tokens: torch.Tensor  # [L] int64
    kv: KV  # every layer's keys and values for all L tokens


class PrefixCache:
    """Token sequences with their KV, found by longest common prefix.

    Args:
        max_tokens: most tokens held over all entries (0 disables the cache).
    """

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._by_first: dict[int, set[int]] = {}  # first token -> entry ids: candidates of a lookup
        self._next_id = 0
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        """False with ``max_tokens`` 0: nothing is shared, every prompt is computed in full."""
        return self.max_tokens > 0

    def match(self, ids: Sequence[int], limit: int) -> tuple[int, KV | None]:
        """The longest prefix of ``ids`` (at most ``limit`` tokens) with cached KV: ``(n, kv)`` where
        ``kv`` covers at least ``n`` tokens (slice it), or ``(0, None)``. The entry counts as used."""
        if not ids or limit <= 0:
            return 0, None
        query = torch.tensor(ids)
        best, best_id = 0, None
        for eid in self._by_first.get(ids[0], ()):
            n = common_prefix_len(self._entries[eid].tokens, query)
            if n > best:
                best, best_id = n, eid
        if best_id is None:
            return 0, None
        self._entries.move_to_end(best_id)
        return min(best, limit), self._entries[best_id].kv

    def insert(self, ids: Sequence[int], kv: KV) -> None:
        """Holds ``kv`` (covering exactly ``ids``) unless an entry already covers ``ids``; entries that
        ``ids`` extends are dropped, then the least recently used ones until the budget holds."""
        if not ids or len(ids) > self.max_tokens:
            return
        tokens = torch.tensor(ids)
        for eid in list(self._by_first.get(ids[0], ())):
            held = self._entries[eid].tokens
            n = common_prefix_len(held, tokens)
            if n == len(tokens):  # already covered
                self._entries.move_to_end(eid)
                return
            if n == len(held):  # the new entry covers this one
                self._drop(eid)
        eid, self._next_id = self._next_id, self._next_id + 1
        self._entries[eid] = _Entry(tokens, kv)
        self._by_first.setdefault(ids[0], set()).add(eid)
        self.tokens += len(ids)
        while self.tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def flush(self) -> None:
        self._entries.clear()
        self._by_first.clear()
        self.tokens = 0

    def _drop(self, eid: int) -> None:
        entry = self._entries.pop(eid)
        first = int(entry.tokens[0])
        self._by_first[first].discard(eid)
        if not self._by_first[first]:
            del self._by_first[first]
        self.tokens -= len(entry.tokens)
