"""What ``model.dtype`` means on the machine a process runs on.

bfloat16 products pay only where the hardware multiplies bfloat16: a GPU, or a CPU with AVX512-BF16
or AMX, where the trainer's step took 0.67x the time of float32. Elsewhere a CPU emulates them, and
the quickstart's step took minutes instead of seconds. ``auto`` therefore means bfloat16 autocast
where it runs in hardware and float32 elsewhere; ``bfloat16`` asks for it everywhere.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

__all__ = ["cpu_bfloat16", "cpu_has_bf16_matmul"]

Dtype = Literal["auto", "float32", "bfloat16"]


@functools.cache
def cpu_has_bf16_matmul() -> bool | None:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX); None: cannot tell."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def cpu_bfloat16(dtype: Dtype) -> bool:
    """Whether a trainer on this CPU autocasts to bfloat16, and an embedded engine multiplies in it:
    always for ``bfloat16``, for ``auto`` where the CPU does it in hardware, never for ``float32``."""
    return dtype == "bfloat16" or (dtype == "auto" and bool(cpu_has_bf16_matmul()))
