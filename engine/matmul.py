"""Linear layers that keep float32 weights but multiply in bfloat16, as the trainer's CPU autocast does.

A decode step multiplies a few rows by every weight matrix. On a CPU with bfloat16 instructions
(AVX512-BF16, AMX) a float32 GEMM at 16 rows runs well below what the hardware can do, and one in
bfloat16 takes about half the time: the built-in engine's decode step of 16 rows ran 1.88x / 1.58x
/ 1.35x faster at 128 / 512 / 2,048 tokens of context, its prefill 1.31-2.19x (SmolLM2-135M, one
thread, ``bench/engine_context.py``). Everything else (norms, attention, softmax, sampling,
logprobs) stays float32, and attention is what grows with the context.

Each layer keeps a bfloat16 copy of its weight, made again when the weight changes in place (a
weight update copies into the parameters). The parameters themselves, their names and any tying
(an ``lm_head`` sharing the embedding) are untouched, so loading weights works as before.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["BF16Linear", "matmul_in_bfloat16"]


class BF16Linear(torch.nn.Linear):
    """An ``nn.Linear`` whose product runs in bfloat16 and returns the input's dtype. Made by
    assigning ``__class__`` to an existing layer (``matmul_in_bfloat16``), for inference only."""

    _half: tuple[Any, ...] | None = None  # (weight version, data pointer, bias version, w, b)

    def _weights(self) -> tuple[Tensor, Tensor | None]:
        w, b = self.weight, self.bias
        key = (w._version, w.data_ptr(), None if b is None else b._version)
        if self._half is None or self._half[:3] != key:
            with torch.no_grad():
                half_w = w.detach().to(torch.bfloat16)
                half_b = None if b is None else b.detach().to(torch.bfloat16)
            self._half = (*key, half_w, half_b)
        return self._half[3], self._half[4]

    def forward(self, x: Tensor) -> Tensor:
        w, b = self._weights()
        return torch.nn.functional.linear(x.to(torch.bfloat16), w, b).to(x.dtype)


def matmul_in_bfloat16(model: torch.nn.Module) -> int:
    """Makes every float32 ``nn.Linear`` of ``model`` a ``BF16Linear``; returns how many."""
    n = 0
    for m in model.modules():
        if type(m) is torch.nn.Linear and m.weight.dtype == torch.float32:
            m.__class__ = BF16Linear
            n += 1
    return n
