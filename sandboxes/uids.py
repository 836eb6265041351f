"""Uid leases: each live sandbox runs as its own uid, so per-uid kernel limits are its own.

The kernel counts some resources per uid, host-wide: inotify instances and watches, RLIMIT_NPROC
processes, POSIX message queue bytes, pending signals. Sandboxes sharing a uid share those
counters, and one sandbox exhausting one starves its neighbours. A lease holds an exclusive
``flock`` on ``<uid>.lock`` in one directory for the whole host (``/tmp/pqrl-sandbox-uids``, or
``$PQRL_SANDBOX_UID_DIR``), whatever a process's ``PQRL_CACHE``: every process sees it, and the
kernel drops it when the holder dies, so a crashed process never strands a uid. A uid still
labelled on a container (``pqrl.uid``, an orphan the reaper has not removed yet) is skipped too.
The directory is private to the user running the sandboxes: one that another user owns, that
others may write or that is a link is refused (they could remove a lock file and lease the uid
again), never used.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import stat
from collections.abc import Collection
from pathlib import Path

from pqrl.envvars import setting
from sandboxes.protocol import SandboxError

__all__ = ["UID_LABEL", "UidLease", "lease_uid", "uid_lock_dir"]

UID_LABEL = "pqrl.uid"
DEFAULT_LOCK_DIR = "/tmp/pqrl-sandbox-uids"


def uid_lock_dir() -> Path:
    """The host's one directory of uid locks, created private (0700) if missing; SandboxError
    naming the fix when it cannot be used safely."""
    path = Path(setting("PQRL_SANDBOX_UID_DIR") or DEFAULT_LOCK_DIR)
    fix = "set PQRL_SANDBOX_UID_DIR to a directory of your own, the same for every pqrl process of the host"
    if not path.is_absolute():  # relative to each process's own working directory: not one place
        raise SandboxError(f"the sandbox uid lock directory {path} is not an absolute path; {fix}")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()
    except OSError as e:
        raise SandboxError(f"cannot create the sandbox uid lock directory {path}: {e.strerror}; {fix}") from e
    if not stat.S_ISDIR(st.st_mode):
        raise SandboxError(f"the sandbox uid lock directory {path} is not a directory (a link?); {fix}")
    if st.st_uid != os.geteuid():
        raise SandboxError(
            f"the sandbox uid lock directory {path} belongs to uid {st.st_uid}, not to this process's "
            f"uid {os.geteuid()}; {fix}"
        )
    if st.st_mode & 0o022:
        raise SandboxError(
            f"the sandbox uid lock directory {path} is writable by others (mode "
            f"{stat.S_IMODE(st.st_mode):o}), who could remove a lock and lease its uid again; {fix}"
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise SandboxError(f"the sandbox uid lock directory {path} is not writable; {fix}")
    return path


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
    lock_dir = lock_dir or uid_lock_dir()
    span = hi - lo
    start = random.randrange(span)  # spreads processes over the range: few lock attempts each
    for i in range(span):
        uid = lo + (start + i) % span
        if uid in skip:
            continue
        try:  # no link followed: a lock file is a plain file of this directory
            fd = os.open(
                lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
            )
        except OSError as e:
            raise SandboxError(f"cannot open the uid lock {lock_dir / f'{uid}.lock'}: {e.strerror}") from e
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
