"""Uid leases: each live sandbox runs as its own uid, so per-uid kernel limits are its own.

The kernel counts some resources per uid, host-wide: inotify instances and watches, RLIMIT_NPROC
processes, POSIX message queue bytes, pending signals. Sandboxes sharing a uid share those
counters, and one sandbox exhausting one starves its neighbours. A lease holds an exclusive
``flock`` on ``<cache>/sandbox-uids/<uid>.lock``: every process of the host sees it, and the
kernel drops it when the holder dies, so a crashed process never strands a uid. A uid still
labelled on a container (``pqrl.uid``, an orphan the reaper has not removed yet) is skipped too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
from collections.abc import Collection
from pathlib import Path

from pqrl.cache import cache_dir
from sandboxes.protocol import SandboxError

__all__ = ["UID_LABEL", "UidLease", "lease_uid"]

UID_LABEL = "pqrl.uid"


class UidLease:
    """One uid held for one sandbox; ``release`` (idempotent) returns it to the pool."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock

    def __del__(self) -> None:
        self.release()


def lease_uid(lo: int, hi: int, *, skip: Collection[int] = (), lock_dir: Path | None = None) -> UidLease:
    """A free uid in ``[lo, hi)``: not locked by any process of this host and not in ``skip``."""
    lock_dir = lock_dir or cache_dir("sandbox-uids")
    span = hi - lo
    start = random.randrange(span)  # spreads processes over the range: few lock attempts each
    for i in range(span):
        uid = lo + (start + i) % span
        if uid in skip:
            continue
        fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        return UidLease(uid, fd)
    raise SandboxError(f"no free sandbox uid in [{lo}, {hi}): every one is leased by a live sandbox")
