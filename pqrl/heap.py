"""Keeps a long-running training process's resident memory near what its tensors need.

glibc's malloc serves requests above a threshold with ``mmap`` (returned to the system on free) and
the rest from its heaps; by default the threshold rises to the size of every large block freed, up
to 32 MiB. A training step allocates and frees activations of a few MiB each, so after the first
step they come from the heaps and leave them fragmented: on the CPU quickstart's shape the trainer
held 6.1 GB after a step whose tensors need 2.5 GB. Three remedies, measured by
``bench/trainer_memory.py`` (``bench/results/trainer_memory_cpu.log``):

- ``trim`` after each step hands the free pages back: the resident set falls back to what the
  tensors hold, at no measurable cost; within a step the heap still fragments (peak 3.8 GB there,
  3.4 GB with bfloat16 matmuls, of which about 0.6 GB free heap pages);
- ``trimming`` (what the trainer loop does around each step) also trims while the step runs, from
  a background thread, whenever the resident set has grown by ``TRIM_GROWTH_BYTES`` since the last
  trim: with bfloat16 matmuls the peak fell from 3.46 GB to 2.71 GB at the same step time (a trim
  every 0.2 s instead reached 2.68 GB but took 1.30x as long: it handed back pages that the next
  layer would have reused);
- ``trim_near_peak`` trims only when the resident set is within ``NEAR_PEAK_BYTES`` of the most
  the process has held (``VmHWM``), where free pages could raise that peak, and has grown by
  ``NEAR_PEAK_GROWTH_BYTES`` since its last trim: the trainer calls it at the start of the backward
  of each decoder layer and of its parts, and before the optimizer step (``trainer.layers``), so
  the end of backward, a step's peak, holds few free pages, at a few trims a step;
- ``fix_mmap_threshold`` (``train.compact_memory``) sends every block of 1 MiB or more to ``mmap``
  for good (setting it turns the dynamic rise off): peak 2.76 GB, but each such block is then
  faulted in afresh, and the step took 1.46x as long.

Beside the heap, torch's CPU kernels (oneDNN) keep every matmul primitive they build, one per
shape, up to 1,024 by default, about 0.8 MiB each: a trainer whose steps each bring new token counts
grew by about 20 MiB a step that way (10 steps measured), until that cache is full.
``bound_kernel_cache`` caps it at ``KERNEL_CACHE_CAPACITY`` primitives. A cap below what one step
uses costs time, since the step then rebuilds kernels it used moments before: at 64 the
quickstart's steps took about 1.14x as long, and capacity 0 (no cache) took 3.5x on the bench.
Kernels kept from earlier steps save little: a quickstart step builds 20-90 new ones in 65-100 ms
of its 10-12 s.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = [
    "KERNEL_CACHE_CAPACITY",
    "MMAP_THRESHOLD",
    "NEAR_PEAK_BYTES",
    "NEAR_PEAK_GROWTH_BYTES",
    "TRIM_GROWTH_BYTES",
    "bound_kernel_cache",
    "fix_mmap_threshold",
    "peak_resident_bytes",
    "resident_bytes",
    "trim",
    "trim_near_peak",
    "trimming",
]

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 1 << 20  # bytes: small objects stay on the heap, tensors of 1 MiB and more do not
# Trimming hands back every free page, also those the next allocation would have reused: they then
# fault in again. Trimming only once the resident set has grown this much since the last trim
# bounds the peak to about this above a post-trim resident set, in few trims
# (bench/results/trainer_memory_cpu.log).
TRIM_GROWTH_BYTES = 128 << 20
# A training step's peak comes at the end of its backward, when every gradient is held beside the
# last layers' working set; free heap pages left there by the growth rule above (up to
# TRIM_GROWTH_BYTES) add to it. Trimming at layer boundaries, and only within this much of the
# process's peak, hands them back at the few points that matter (trim_near_peak).
NEAR_PEAK_BYTES = 64 << 20
NEAR_PEAK_GROWTH_BYTES = 16 << 20
_near_peak_floor = 0  # the resident set after trim_near_peak's last trim, or the lowest seen since
_POLL_S = 0.05  # reading /proc/self/statm costs microseconds
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h
# oneDNN primitives kept per process (oneDNN's default: 1,024). A quickstart step uses about 90:
# 128 holds one step's with room; against 256 the job peaked about 50 MiB lower at the same step
# time, and at 64 its steps took 1.14x as long (bench/results/quickstart_cpu.log). A job whose
# steps use more (more episodes or turns per step) can raise ONEDNN_PRIMITIVE_CACHE_CAPACITY.
KERNEL_CACHE_CAPACITY = 128
_KERNEL_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def bound_kernel_cache(capacity: int = KERNEL_CACHE_CAPACITY) -> int:
    """Caps oneDNN's primitive cache at ``capacity`` unless ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` is
    set already (the user's choice stands); returns the capacity in force. oneDNN reads it when it
    builds its first primitive, so call this before the process's first CPU matmul; child
    processes started afterwards inherit it."""
    return int(os.environ.setdefault(_KERNEL_CACHE_ENV, str(capacity)))


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


def resident_bytes() -> int | None:
    """This process's resident set (``/proc/self/statm``); None where there is no procfs."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def peak_resident_bytes() -> int | None:
    """The most this process has held resident so far (``VmHWM``); None where there is no procfs."""
    try:
        with open("/proc/self/status", "rb") as f:
            line = next((x for x in f if x.startswith(b"VmHWM:")), None)
        return None if line is None else int(line.split()[1]) << 10
    except (OSError, IndexError, ValueError):
        return None


def trim_near_peak(margin_bytes: int = NEAR_PEAK_BYTES, growth_bytes: int = NEAR_PEAK_GROWTH_BYTES) -> bool:
    """Trims when the resident set is within ``margin_bytes`` of the most this process has ever held
    (only there can free heap pages raise that peak) and has grown by ``growth_bytes`` since the
    last such trim or the lowest it has been seen at since (below that, the pages a trim would hand
    back are ones the next allocations reuse); returns whether it trimmed. Two reads of procfs when
    it does not: cheap enough at every decoder layer's backward."""
    global _near_peak_floor
    rss, peak = resident_bytes(), peak_resident_bytes()
    if rss is None or peak is None:
        return False
    _near_peak_floor = min(_near_peak_floor, rss)
    if rss < peak - margin_bytes or rss - _near_peak_floor < growth_bytes:
        return False
    trimmed = trim()
    _near_peak_floor = resident_bytes() or 0
    return trimmed


@contextlib.contextmanager
def trimming(growth_bytes: int = TRIM_GROWTH_BYTES, poll_s: float = _POLL_S) -> Iterator[None]:
    """While the body runs, trims whenever the resident set has grown by ``growth_bytes`` since the
    last trim (checked every ``poll_s`` seconds from a background thread), then once more at its
    end. What this bounds is the peak: at most ``growth_bytes`` above what was resident after some
    trim. Pages freed without growing the set stay until the next growth sets off a trim.
    ``malloc_trim`` takes each arena's lock in turn, so it is safe beside threads that allocate;
    they wait at most the length of one arena's trim."""
    if not trim() or resident_bytes() is None:  # no glibc or no procfs: nothing to trim or watch
        yield
        return
    stop = threading.Event()
    floor = resident_bytes() or 0

    def run() -> None:
        nonlocal floor
        while not stop.wait(poll_s):
            if (resident_bytes() or 0) - floor >= growth_bytes:
                trim()
                floor = resident_bytes() or 0

    thread = threading.Thread(target=run, name="heap-trim", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        trim()
