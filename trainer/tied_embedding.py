"""The input embedding's gradient added in place into ``weight.grad`` when the weight is tied to
the output head (as in SmolLM2, Llama 3.2 1B/3B and Qwen2.5 0.5B-3B).

Autograd sums the two uses of a tied weight in one buffer before accumulating: the head's dense
``[V, H]`` gradient waits there through the whole backward, and the embedding's backward, the last
op of it, allocates a second ``[V, H]`` tensor (``embedding_dense_backward``'s zeros, or the
out-of-place sum when its gradient is sparse) beside every other gradient: 108 MiB on top of the
step's peak for SmolLM2-135M. Here the lookup is a function of a detached weight, so the head's
gradient goes straight to ``weight.grad`` and the lookup's backward adds one row per input token
into it with ``index_add_``: the same sum, no ``[V, H]`` temporary.

``weight.grad`` then holds the head's part before the lookup's is added: hooks that read it as
soon as it is accumulated (``register_post_accumulate_grad_hook``, DDP, FSDP) would miss the
lookup's rows, so this is only for one process with plain parameters (``tied_input_embedding``
says which models qualify).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["rows_into_grad", "tied_input_embedding"]


def tied_input_embedding(model: Any) -> torch.nn.Embedding | None:
    """``model``'s input embedding when it is a plain ``nn.Embedding`` sharing its (plain,
    non-sharded, trained) weight with the output head and adding gradient rows the default way (no
    ``max_norm``, ``scale_grad_by_freq`` or ``sparse``); None otherwise."""
    try:
        emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if type(emb) is not torch.nn.Embedding or head is None:
        return None
    if emb.max_norm is not None or emb.scale_grad_by_freq or emb.sparse:
        return None
    weight = emb.weight
    if getattr(head, "weight", None) is not weight or type(weight) is not torch.nn.Parameter:
        return None  # untied, or a DTensor shard under FSDP2
    if not weight.requires_grad:  # frozen: the lookup's backward must not give it a gradient
        return None
    return emb


@contextlib.contextmanager
def rows_into_grad(model: Any) -> Iterator[None]:
    """While open, ``model``'s tied input embedding (if any) adds its gradient rows straight into
    its weight's ``.grad``; a backward of what was computed inside must run before it closes or
    use the lookups it made."""
    emb = tied_input_embedding(model)
    if emb is None:
        yield
        return
    emb.forward = lambda ids: _RowsIntoGrad.apply(ids, torch.empty(0, requires_grad=True), emb)
    try:
        yield
    finally:
        del emb.forward  # the class's forward again


class _RowsIntoGrad(torch.autograd.Function):
    """``F.embedding(ids, emb.weight)`` whose backward adds into ``emb.weight.grad`` in place.

    The weight enters detached, so autograd routes none of its gradient through here; ``anchor``
    (empty, requiring grad) only puts this function in the graph, and gets no gradient."""

    @staticmethod
    def forward(ctx: Any, ids: Tensor, anchor: Tensor, emb: torch.nn.Embedding) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.emb = emb
        return F.embedding(ids, emb.weight.detach(), emb.padding_idx)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[None, None, None]:
        (ids,) = ctx.saved_tensors
        emb = ctx.emb
        weight = emb.weight
        index, rows = ids.reshape(-1), grad_out.reshape(-1, weight.shape[1])
        if emb.padding_idx is not None:  # nn.Embedding leaves the padding row's gradient at 0
            keep = index != emb.padding_idx
            index, rows = index[keep], rows[keep]
        # The head's part was accumulated first (an accumulation runs as soon as its inputs are in);
        # None when the head took no gradient in this backward.
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        weight.grad.index_add_(0, index, rows.to(weight.grad.dtype))
        return None, None, None
