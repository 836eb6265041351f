"""The tensors of a weight update, as the built-in engine takes them in.

New weights come from a checkpoint directory (``load_state_dict``, for ``BatchEngine.load_weights``) or
as one broadcast per tensor from a trainer over a process group of their own
(``pqrl.collective.init_weights_group``, ``receive_weights``: SGLang's NCCL path, which gloo carries
on CPU); ``BatchEngine.load_state`` checks a whole set before copying any of it.

Imports only torch, safetensors (which transformers requires), the standard library and
``pqrl.collective`` (standard library only), so it runs on a bare GPU box.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch

from pqrl.collective import broadcast_from_rank0

__all__ = ["load_state_dict", "parse_dtype", "receive_weights"]


def load_state_dict(model_path: str | Path, device: torch.device) -> dict[str, torch.Tensor]:
    """All tensors of the ``*.safetensors`` files in a Hugging Face model directory."""
    from safetensors.torch import load_file

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f), device=str(device)))
    return state


# -- weights broadcast by a trainer (SGLang's update_weights_from_distributed) ----------------------


def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` (SGLang's wire form) or ``"torch.bfloat16"`` as a torch dtype."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def receive_weights(
    group: Any,
    names: list[str],
    dtypes: list[torch.dtype],
    shapes: list[list[int]],
    device: torch.device | str,
) -> dict[str, torch.Tensor]:
    """Receives one broadcast from rank 0 per ``(name, dtype, shape)``, in that order.

    Everything is received before anything is checked, so the sender never waits on a rejected
    update; then ``ValueError`` if a name repeats.
    """
    tensors = [
        torch.empty(shape, dtype=dtype, device=device) for dtype, shape in zip(dtypes, shapes, strict=True)
    ]
    broadcast_from_rank0(group, tensors)
    repeated = sorted(n for n, k in Counter(names).items() if k > 1)
    if repeated:
        raise ValueError(f"tensor names sent more than once: {repeated[:5]}")
    return dict(zip(names, tensors, strict=True))
