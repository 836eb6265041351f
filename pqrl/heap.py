"""Keeps a long-running training process's resident memory near what its tensors need.

glibc's malloc serves requests above a threshold with ``mmap`` (returned to the system on free) and
the rest from its heap; by default the threshold rises to the size of every large block freed, up
to 32 MiB. A training step allocates and frees activations of a few MiB each, so after the first
step they come from the heap and leave it fragmented: on the CPU quickstart the trainer's resident
set grew to 5 GB where its tensors hold 2.5 GB. A fixed threshold sends those blocks to ``mmap`` for
good (setting it also turns the dynamic rise off); ``bench/trainer_memory.py`` measures both.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

__all__ = ["MMAP_THRESHOLD", "fix_mmap_threshold"]

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 1 << 20  # bytes: small objects stay on the heap, tensors of 1 MiB and more do not
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fixes glibc's mmap threshold at ``threshold`` bytes; False (nothing done) off glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, threshold))
    if not done:
        log.warning("mallopt(M_MMAP_THRESHOLD, %d) failed: freed activations may grow the heap", threshold)
    return done
