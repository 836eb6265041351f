"""Keeps a long-running training process's resident memory near what its tensors need.

glibc's malloc serves requests above a threshold with ``mmap`` (returned to the system on free) and
the rest from its heaps; by default the threshold rises to the size of every large block freed, up
to 32 MiB. A training step allocates and frees activations of a few MiB each, so after the first
step they come from the heaps and leave them fragmented: on the CPU quickstart's shape the trainer
held 6.1 GB after a step whose tensors need 2.5 GB. Two remedies, measured by
``bench/trainer_memory.py`` (``bench/results/trainer_memory_cpu.log``):

- ``trim`` after each step hands the free pages back (the trainer loop always does): the resident
  set falls back to what the tensors hold, at no measurable cost; within a step the heap still
  fragments (peak 3.8 GB there);
- ``fix_mmap_threshold`` (``train.compact_memory``) sends every block of 1 MiB or more to ``mmap``
  for good (setting it turns the dynamic rise off): peak 2.76 GB, but each such block is then
  faulted in afresh, and the step took 1.46x as long.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys
from typing import Any

__all__ = ["MMAP_THRESHOLD", "fix_mmap_threshold", "trim"]

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 1 << 20  # bytes: small objects stay on the heap, tensors of 1 MiB and more do not
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h


@functools.cache  # find_library runs ldconfig in a subprocess: once per process, not per step
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fixes glibc's mmap threshold at ``threshold`` bytes; False (nothing done) off glibc."""
    mallopt = getattr(_libc(), "mallopt", None)  # musl and other libcs have none
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, threshold))
    if not done:
        log.warning("mallopt(M_MMAP_THRESHOLD, %d) failed: freed activations may grow the heap", threshold)
    return done


def trim() -> bool:
    """Returns the free pages of every malloc arena to the system (glibc's ``malloc_trim``); False
    off glibc. Cheap enough to call after every training step."""
    fn = getattr(_libc(), "malloc_trim", None)
    if fn is None:
        return False
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    fn(0)
    return True
