"""The optimizer every trainer here builds: AdamW, as one fused kernel where torch has one.

torch's default AdamW on the CPU loops over the parameters running about eight elementwise ops on
each, one of which makes a temporary the size of the parameter (113 MB for SmolLM2-135M's
embedding). The fused kernel reads each parameter, gradient and moment once and writes them once,
and allocates nothing. On the CPU quickstart's shape the whole step took the same time either way
(``bench/trainer_memory.py``, bf16_trim against bf16_fused). It computes the same update; the
rounding of a few operations differs, as between any two kernels.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["adamw", "fusable"]

_FUSED_DEVICES = ("cpu", "cuda")
_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def fusable(params: Iterable[Any]) -> bool:
    """Whether torch's fused AdamW takes every one of ``params``: plain tensors (not FSDP2's
    DTensor shards, which keep the default path), all on one CPU or CUDA device type, floating."""
    params = list(params)
    return bool(params) and all(
        not hasattr(p, "full_tensor")
        and p.device.type == params[0].device.type in _FUSED_DEVICES
        and p.dtype in _FUSED_DTYPES
        for p in params
    )


def adamw(
    params: Iterable[Any], *, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> torch.optim.AdamW:  # fmt: skip
    """``torch.optim.AdamW`` over ``params``, fused when ``fusable(params)``; loading a state saved
    by the other kernel keeps this one."""
    params = list(params)
    optimizer = torch.optim.AdamW(
        params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fusable(params) or None
    )
    optimizer.register_load_state_dict_post_hook(_keep_kernel)
    return optimizer


def _keep_kernel(optimizer: torch.optim.Optimizer) -> None:
    """A loaded state brings its param groups' kernel choice: an older checkpoint would switch the
    fused kernel off. Restores this optimizer's, with the step counts where that kernel keeps them."""
    fused = optimizer.defaults.get("fused")
    for group in optimizer.param_groups:
        if group.get("fused") == fused:
            continue
        group["fused"] = fused
        for p in group["params"] if fused else ():
            state = optimizer.state.get(p, {})
            if torch.is_tensor(state.get("step")):  # the fused kernel reads it on the device, float32
                state["step"] = state["step"].to(device=p.device, dtype=torch.float32)
