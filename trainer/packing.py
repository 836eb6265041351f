"""Sequence packing: variable-length token sequences laid end to end in rows with no padding.

A packed row holds whole sequences back to back; ``position_ids`` restart at 0 for each one, and
attention must never cross a sequence boundary. What isolates sequences depends on the attention
implementation and the transformers version, and passing ``position_ids`` alone is not enough: in
transformers 5.x the sdpa/eager mask builder detects packed positions only when no 2D mask and no
cache are given (the default ``use_cache=True`` creates a cache, so sequences silently attend to
each other), and then it builds a dense ``[L, L]`` mask. So ``enable_packed_attention`` installs
one of three isolations, in order of preference:

- ``"flash"``: the model already runs a flash-attention implementation, which reads the restarts
  of ``position_ids`` and calls the variable-length kernel;
- ``"varlen"``: an attention function registered with transformers' ``AttentionInterface`` that
  runs causal sdpa once per sequence (flash kernel on GPU, no mask, no wasted FLOPs), and hands
  every call without packing metadata (generation, padded batches) to the model's previous
  implementation unchanged;
- ``"mask"``: transformers without ``AttentionInterface`` (< 4.48) get an explicit block-diagonal
  causal 4D mask (exact, but attention costs ``L^2`` per row).

``tests/trainer/test_packing.py`` proves each against per-sequence unpadded forwards.

Shared prefixes: the G episodes of a GRPO group start with the same prompt (in the calc quickstart
a few hundred tokens of worked examples, against about 50 generated). A row may store such a prompt
once as a *root* segment and each continuation as a *child* segment that attends to all of its
parent and causally to itself, with positions continuing from the parent's length. Every child
token then sees exactly the keys, values and positions it would see in its own unshared sequence,
so logprobs and gradients are those of the unshared computation (the parent's gradient is the sum of
what each copy would have received); the forward and backward run over the prompt once instead of G
times. ``share_prefixes`` lays a row out, ``shared_rows`` packs rows by that cost. The varlen and
mask isolations support it; flash does not (its kernel reads sequence starts from position
restarts only).

Deliberately left out: several rows per micro-batch (one row is the micro-batch), sliding-window
and soft-capped attention in the varlen path, splitting a sequence longer than the budget, and
prefixes shared more than one level deep (a tree of turns).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = [
    "PackedRow",
    "SharedLayout",
    "block_causal_mask",
    "enable_packed_attention",
    "first_fit_decreasing",
    "pack_row",
    "prefix_key",
    "packed_model_kwargs",
    "segment_attention",
    "share_prefixes",
    "shared_rows",
]

_PREFIX = "pqrl_packed:"  # attention implementation name: prefix + the implementation it wraps
SEQ_LENS_KWARG = "pqrl_seq_lens"  # how the sequence lengths of a row reach the attention function
PARENTS_KWARG = "pqrl_parents"  # and each segment's parent segment (-1: none)


def first_fit_decreasing(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Groups indices of ``lengths`` into rows whose total length stays within ``budget``.

    First-fit decreasing: longest first, each into the first row with room. A sequence longer
    than the budget gets a row of its own (it is never split).
    """
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(budget - lengths[i])
    return rows


@dataclass(frozen=True)
class PackedRow:
    """One packed row: ``input_ids`` and ``position_ids`` are ``[1, L]``, ``L = sum(seq_lens)``.

    ``parents[j]`` is the segment that segment ``j`` continues (-1 for none); empty when no segment
    has one."""

    input_ids: Tensor
    position_ids: Tensor
    seq_lens: tuple[int, ...]
    parents: tuple[int, ...] = ()

    @property
    def offsets(self) -> list[int]:
        """Start of each segment in the row."""
        return _starts(self.seq_lens)


def _starts(lengths: Sequence[int]) -> list[int]:
    """The start of each segment when segments of ``lengths`` are laid end to end."""
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int).tolist()


def pack_row(
    sequences: Sequence[np.ndarray], device: torch.device | str = "cpu", parents: Sequence[int] = ()
) -> PackedRow:
    """Concatenates token segments into one row. A segment without a parent starts at position 0; a
    child of segment ``p`` (``parents``, -1 for none; ``p`` earlier and itself a root) continues at
    ``len(sequences[p])``."""
    lens = tuple(int(len(s)) for s in sequences)
    if not lens or min(lens) == 0:
        raise ValueError("cannot pack empty sequences")
    parents = tuple(int(p) for p in parents)
    if parents and (
        len(parents) != len(lens) or any(not -1 <= p < j or (p >= 0 and parents[p] >= 0)
                                         for j, p in enumerate(parents))
    ):  # fmt: skip
        raise ValueError(f"parents must name an earlier root segment or -1 for each segment; got {parents}")
    if parents and max(parents) < 0:
        parents = ()
    starts = [lens[p] if p >= 0 else 0 for p in parents] if parents else [0] * len(lens)
    ids = torch.from_numpy(np.concatenate(sequences).astype(np.int64))
    pos = torch.from_numpy(np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens, strict=True)]))
    return PackedRow(ids[None].to(device), pos[None].to(device), lens, parents)


@dataclass(frozen=True)
class SharedLayout:
    """A row's segments and, per sequence, where its tokens live: ``prefix[i]`` the segment holding
    its first ``shared[i]`` tokens (-1 when nothing is shared) and ``own[i]`` the segment of the rest."""

    segments: list[np.ndarray]
    parents: list[int]
    prefix: list[int]
    own: list[int]
    shared: list[int]

    def rows_of(self, i: int, index: np.ndarray, offsets: Sequence[int]) -> np.ndarray:
        """Row positions of sequence ``i``'s token positions ``index``."""
        k = self.shared[i]
        if k == 0:
            return offsets[self.own[i]] + index
        return np.where(index < k, offsets[self.prefix[i]] + index, offsets[self.own[i]] + index - k)


def prefix_key(sequence: np.ndarray, shareable: int) -> bytes | None:
    """What identifies the first ``shareable`` tokens of ``sequence`` (None: nothing to share)."""
    return shareable.to_bytes(4, "little") + np.asarray(sequence[:shareable]).tobytes() if shareable else None


def share_prefixes(sequences: Sequence[np.ndarray], shareable: Sequence[int]) -> SharedLayout:
    """Lays out a row where sequences whose first ``shareable[i]`` tokens are identical (same length
    and tokens) store them once, as a root segment that each continuation's segment attends to.

    A prefix is shared only by two or more sequences; ``shareable[i]`` must leave sequence ``i`` at
    least one token of its own (0: never shared)."""
    by_prefix: dict[bytes, list[int]] = {}
    for i, (seq, k) in enumerate(zip(sequences, shareable, strict=True)):
        if not 0 <= k < len(seq):
            raise ValueError(f"sequence {i}: shareable length {k} must leave it a token of its own")
        key = prefix_key(seq, k)
        if key is not None:
            by_prefix.setdefault(key, []).append(i)
    segments: list[np.ndarray] = []
    parents: list[int] = []
    n = len(sequences)
    prefix, own, shared = [-1] * n, [-1] * n, [0] * n
    sharers = {i: members for members in by_prefix.values() if len(members) > 1 for i in members}
    for i, seq in enumerate(sequences):
        if own[i] >= 0:
            continue
        if i not in sharers:
            own[i] = len(segments)
            segments.append(seq)
            parents.append(-1)
            continue
        root, k = len(segments), shareable[i]
        segments.append(seq[:k])
        parents.append(-1)
        for j in sharers[i]:
            prefix[j], own[j], shared[j] = root, len(segments), k
            segments.append(sequences[j][k:])
            parents.append(root)
    return SharedLayout(segments, parents, prefix, own, shared)


def shared_rows(lengths: Sequence[int], prefixes: Sequence[bytes | None], shared: Sequence[int],
                budget: int) -> list[list[int]]:  # fmt: skip
    """``first_fit_decreasing`` where sequences with the same ``prefixes`` key (None: no prefix to
    share) cost their ``shared`` leading tokens once per row: each key's sequences are first bundled
    (longest first) while the prompt plus their continuations fit ``budget``, then bundles are packed."""
    units: list[list[int]] = []
    by_key: dict[bytes, list[int]] = {}
    for i, key in enumerate(prefixes):
        if key is None:
            units.append([i])
        else:
            by_key.setdefault(key, []).append(i)
    for members in by_key.values():
        members.sort(key=lambda i: -lengths[i])
        bundle, cost = [members[0]], lengths[members[0]]
        for i in members[1:]:
            tail = lengths[i] - shared[i]
            if cost + tail > budget:
                units.append(bundle)
                bundle, cost = [i], lengths[i]
            else:
                bundle.append(i)
                cost += tail
        units.append(bundle)

    costs = [lengths[u[0]] + sum(lengths[i] - shared[i] for i in u[1:]) for u in units]
    rows = first_fit_decreasing(costs, budget)
    return [[i for u in row for i in units[u]] for row in rows]


def segment_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    seq_lens: Sequence[int],
    *,
    scaling: float | None,
    dropout: float,
    parents: Sequence[int] = (),
) -> Tensor:
    """Causal attention within each segment of a packed row, plus all of its parent segment.

    Args:
        query: ``[1, H, L, D]``; key, value: ``[1, H_kv, L, D]`` (grouped-query heads: read in place
            by the CPU kernels, repeated here elsewhere).
        seq_lens: lengths of the segments laid end to end, summing to ``L``.
        parents: each segment's parent (-1: none); empty when none has one (see ``pack_row``).

    Returns:
        ``[1, L, H, D]``, the layout transformers' attention functions return.
    """
    sdpa = functools.partial(F.scaled_dot_product_attention, dropout_p=dropout, scale=scaling)
    if key.shape[1] != query.shape[1]:
        if _native_gqa(query):  # no repeated copies of keys and values, nor their backward's sums
            sdpa = functools.partial(sdpa, enable_gqa=True)
        else:
            groups = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    # split, not sliced per segment: a slice's backward writes its gradient into zeros the size of
    # the whole row, so slicing costs segments x row length in the backward; split's backward is one cat
    qs, ks, vs = (x.split(list(seq_lens), dim=2) for x in (query, key, value))
    out = []
    for j, n in enumerate(seq_lens):
        q, k, v = qs[j], ks[j], vs[j]
        p = parents[j] if parents else -1
        if p < 0:
            o = sdpa(q, k, v, is_causal=True)
        else:  # the whole parent, then causal within the segment
            pn = seq_lens[p]
            k, v = torch.cat([ks[p], k], dim=2), torch.cat([vs[p], v], dim=2)
            allowed = torch.ones(n, pn + n, dtype=torch.bool, device=q.device).tril(diagonal=pn)
            o = sdpa(q, k, v, attn_mask=allowed)
        out.append(o)
    return torch.cat(out, dim=2).transpose(1, 2).contiguous()


def _native_gqa(query: Tensor) -> bool:
    """Whether sdpa takes grouped-query heads as they are (``enable_gqa``, torch >= 2.5) for this
    tensor: on the CPU, where its kernels do (on a bfloat16 row of 2,240 tokens, 9 query and 3 key
    heads, 0.10 s a layer's forward and backward instead of 0.13-0.16 s). CUDA keeps the repeat:
    its memory-efficient kernel, which the masked children need, has not always taken them."""
    return query.device.type == "cpu" and _sdpa_takes_gqa()


@functools.cache
def _sdpa_takes_gqa() -> bool:
    q, kv = torch.zeros(1, 2, 1, 1), torch.zeros(1, 1, 1, 1)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except (TypeError, RuntimeError):
        return False
    return True


def _varlen_attention(base: str):
    """An attention function: per-sequence sdpa for packed rows, ``base`` for everything else."""

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        seq_lens = kwargs.pop(SEQ_LENS_KWARG, None)
        parents = kwargs.pop(PARENTS_KWARG, ())
        if seq_lens is None:
            return _base_attention(module, base)(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        kw = {"scaling": scaling, "dropout": dropout, "parents": parents}
        return segment_attention(query, key, value, seq_lens, **kw), None

    return attention


def _base_attention(module: Any, name: str):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[name]
    # "eager" lives in each modeling file, not in the registry
    return sys.modules[type(module).__module__].eager_attention_forward


def _register(name: str, base: str) -> bool:
    """Registers the varlen attention (and the base's mask builder) as ``name``; False if unsupported."""
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:
        return False
    if hasattr(ALL_ATTENTION_FUNCTIONS, "register"):
        type(ALL_ATTENTION_FUNCTIONS).register(name, _varlen_attention(base))
    else:  # 4.48-4.49: a plain dict
        ALL_ATTENTION_FUNCTIONS[name] = _varlen_attention(base)
    try:  # >= 4.53 builds masks per implementation; older versions build a generic 4D mask
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    except ImportError:
        return True
    # sdpa's builder returns no mask for an all-ones 2D mask (what packed rows pass), eager's a dense one
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS["eager" if base == "eager" else "sdpa"]
    type(ALL_MASK_ATTENTION_FUNCTIONS).register(name, mask_fn)
    return True


def enable_packed_attention(model: Any, mode: str | None = None) -> str:
    """Makes ``model`` isolate the sequences of packed rows; returns the isolation in use.

    Idempotent. ``mode`` forces ``"varlen"`` or ``"mask"`` (tests); by default the best available
    (see the module docstring). The varlen mode changes ``model.config._attn_implementation`` for
    good (it must hold during a gradient-checkpointing recompute too); unpacked calls behave as before.
    """
    if mode == "mask":  # works with any implementation, wrapped or not
        return "mask"
    current = getattr(model.config, "_attn_implementation", None) or "eager"
    if current.startswith(_PREFIX):
        return "varlen"
    if mode is None and current.startswith("flash_attention"):
        return "flash"
    name = _PREFIX + current
    if not _register(name, current):
        return "mask" if mode is None else _fail("varlen")
    model.config._attn_implementation = name
    return "varlen"


def _fail(mode: str) -> str:
    raise ValueError(f"packed attention mode {mode!r} is not available for this model")


def block_causal_mask(
    seq_lens: Sequence[int], dtype: torch.dtype, device: torch.device | str, parents: Sequence[int] = ()
) -> Tensor:
    """``[1, 1, L, L]`` additive mask: 0 where a token may attend (earlier in its own segment, or
    anywhere in its segment's parent), else min."""
    seq = torch.repeat_interleave(
        torch.arange(len(seq_lens), device=device), torch.tensor(seq_lens, device=device)
    )
    idx = torch.arange(len(seq), device=device)
    allowed = (seq[:, None] == seq[None, :]) & (idx[:, None] >= idx[None, :])
    if parents:
        parent_of = torch.tensor(parents, device=device)[seq]
        allowed |= parent_of[:, None] == seq[None, :]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )
    return mask[None, None]


def packed_model_kwargs(model: Any, row: PackedRow, mode: str) -> dict[str, Any]:
    """Keyword arguments for ``model(...)`` or its base model to run ``row`` with isolated sequences."""
    kwargs: dict[str, Any] = {
        "input_ids": row.input_ids,
        "position_ids": row.position_ids,
        "use_cache": False,
    }
    if mode == "varlen":
        # an all-ones 2D mask stops transformers from building a dense packed-sequence mask we never read
        kwargs["attention_mask"] = torch.ones_like(row.input_ids)
        kwargs[SEQ_LENS_KWARG] = row.seq_lens
        if row.parents:
            kwargs[PARENTS_KWARG] = row.parents
    elif mode == "mask":
        dtype = next(model.parameters()).dtype
        kwargs["attention_mask"] = block_causal_mask(row.seq_lens, dtype, row.input_ids.device, row.parents)
    elif row.parents:
        raise ValueError(f"packed attention mode {mode!r} cannot run a row with shared prefixes")
    elif mode != "flash":
        raise ValueError(f"unknown packed attention mode {mode!r}")
    return kwargs
