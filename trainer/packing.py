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

Deliberately left out: several rows per micro-batch (one row is the micro-batch), sliding-window
and soft-capped attention in the varlen path, and splitting a sequence longer than the budget.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "PackedRow",
    "block_causal_mask",
    "enable_packed_attention",
    "first_fit_decreasing",
    "pack_row",
    "packed_model_kwargs",
    "segment_attention",
]

_PREFIX = "pqrl_packed:"  # attention implementation name: prefix + the implementation it wraps
SEQ_LENS_KWARG = "pqrl_seq_lens"  # how the sequence lengths of a row reach the attention function


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
    """One packed row: ``input_ids`` and ``position_ids`` are ``[1, L]``, ``L = sum(seq_lens)``."""

    input_ids: Tensor
    position_ids: Tensor
    seq_lens: tuple[int, ...]

    @property
    def offsets(self) -> list[int]:
        """Start of each sequence in the row."""
        return np.concatenate([[0], np.cumsum(self.seq_lens)[:-1]]).astype(int).tolist()


def pack_row(sequences: Sequence[np.ndarray], device: torch.device | str = "cpu") -> PackedRow:
    """Concatenates token sequences into one row, positions restarting at 0 for each."""
    lens = tuple(int(len(s)) for s in sequences)
    if not lens or min(lens) == 0:
        raise ValueError("cannot pack empty sequences")
    ids = torch.from_numpy(np.concatenate(sequences).astype(np.int64))
    pos = torch.from_numpy(np.concatenate([np.arange(n) for n in lens]))
    return PackedRow(ids[None].to(device), pos[None].to(device), lens)


def segment_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    seq_lens: Sequence[int],
    *,
    scaling: float | None,
    dropout: float,
) -> Tensor:
    """Causal attention within each sequence of a packed row.

    Args:
        query: ``[1, H, L, D]``; key, value: ``[1, H_kv, L, D]`` (grouped-query heads repeated here).
        seq_lens: lengths of the sequences laid end to end, summing to ``L``.

    Returns:
        ``[1, L, H, D]``, the layout transformers' attention functions return.
    """
    if key.shape[1] != query.shape[1]:
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out, start = [], 0
    for n in seq_lens:
        q, k, v = (x[:, :, start : start + n] for x in (query, key, value))
        out.append(
            torch.nn.functional.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=True, scale=scaling
            )
        )
        start += n
    return torch.cat(out, dim=2).transpose(1, 2).contiguous()


def _varlen_attention(base: str):
    """An attention function: per-sequence sdpa for packed rows, ``base`` for everything else."""

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        seq_lens = kwargs.pop(SEQ_LENS_KWARG, None)
        if seq_lens is None:
            return _base_attention(module, base)(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        return segment_attention(query, key, value, seq_lens, scaling=scaling, dropout=dropout), None

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


def block_causal_mask(seq_lens: Sequence[int], dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """``[1, 1, L, L]`` additive mask: 0 where a token may attend (same sequence, not later), else min."""
    seq = torch.repeat_interleave(
        torch.arange(len(seq_lens), device=device), torch.tensor(seq_lens, device=device)
    )
    idx = torch.arange(len(seq), device=device)
    allowed = (seq[:, None] == seq[None, :]) & (idx[:, None] >= idx[None, :])
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
    elif mode == "mask":
        dtype = next(model.parameters()).dtype
        kwargs["attention_mask"] = block_causal_mask(row.seq_lens, dtype, row.input_ids.device)
    elif mode != "flash":
        raise ValueError(f"unknown packed attention mode {mode!r}")
    return kwargs
