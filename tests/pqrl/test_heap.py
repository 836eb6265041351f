"""The heap trims that keep the trainer's resident set near what its tensors hold, measured on this
process's own glibc heap: blocks small enough for malloc's heap, freed with every 16th kept so that
the free pages sit between live blocks where no ordinary ``free`` returns them."""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

import pytest

from pqrl import heap

pytestmark = pytest.mark.skipif(heap._libc() is None or not hasattr(heap._libc(), "malloc_trim"),
                                reason="glibc only: other libcs have no malloc_trim")  # fmt: skip

BLOCK, COUNT = 64 << 10, 2048  # 128 MiB in blocks under glibc's smallest mmap threshold


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def _fragment() -> list[int]:
    """Allocates and touches COUNT blocks, frees all but every 16th; returns the kept ones."""
    libc = heap._libc()
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(BLOCK) for _ in range(COUNT)]
    for b in blocks:
        ctypes.memset(b, 1, BLOCK)
    for i, b in enumerate(blocks):
        if i % 16:
            libc.free(b)
    return [b for i, b in enumerate(blocks) if i % 16 == 0]


def _free(blocks: list[int]) -> None:
    for b in blocks:
        heap._libc().free(b)


def test_trim_hands_back_free_pages_between_live_blocks():
    heap.trim()
    base = _rss_mb()
    kept = _fragment()
    try:
        assert _rss_mb() - base > 96, "free() alone kept the freed blocks resident (the premise)"
        assert heap.trim()
        assert _rss_mb() - base < 48, "the 120 MiB freed between live blocks stayed resident"
    finally:
        _free(kept)


def test_trimming_trims_while_the_body_runs_and_stops_after():
    """What trimming bounds is the resident set's growth since its last trim: pages freed on the
    heap do not grow it, so they stay until the next growth (here a 64 MiB block) sets off a trim
    that hands them back. Without one the set would be 192 MiB above where it started."""
    heap.trim()
    base, kept, big = _rss_mb(), [], None
    try:
        with heap.trimming(32 << 20, poll_s=0.01):
            kept = _fragment()
            big = heap._libc().malloc(64 << 20)
            ctypes.memset(big, 1, 64 << 20)
            deadline = time.monotonic() + 5
            while _rss_mb() - base > 64 + 48 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _rss_mb() - base < 64 + 48, "nothing was trimmed while the body ran"
            assert any(t.name == "heap-trim" for t in threading.enumerate())
        assert not any(t.name == "heap-trim" for t in threading.enumerate())
    finally:
        _free(kept + ([big] if big else []))


def test_trimming_stops_when_the_body_raises():
    with pytest.raises(RuntimeError), heap.trimming(poll_s=0.01):
        raise RuntimeError("step failed")
    assert not any(t.name == "heap-trim" for t in threading.enumerate())


def test_trim_near_peak_trims_only_within_its_margin_of_the_peak_and_after_growth():
    """Free pages matter only where they could raise the process's peak (VmHWM): below the margin
    they stay, within it they go back; and a trim follows another only once the resident set has
    grown again (it had not: the pages a trim would return are ones the next allocations reuse)."""
    heap.trim()
    heap.trim_near_peak(margin_bytes=1 << 62, growth_bytes=0)  # resets its floor to here
    kept = _fragment()
    try:
        high = _rss_mb()
        gap = heap.peak_resident_bytes() - heap.resident_bytes()
        assert not heap.trim_near_peak(margin_bytes=gap - (8 << 20)), "trimmed 8 MiB below its margin"
        assert _rss_mb() > high - 16, "the fragmented pages went back without a trim"
        assert heap.trim_near_peak(margin_bytes=gap + (64 << 20))  # grown by 128 MiB since the floor
        assert _rss_mb() < high - 96, "the 120 MiB freed between live blocks stayed resident"
        assert not heap.trim_near_peak(margin_bytes=1 << 62), "trimmed again without growth"
    finally:
        _free(kept)
