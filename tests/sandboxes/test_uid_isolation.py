"""Per-uid kernel limits are per sandbox: each live sandbox runs as a uid of its own, leased from a
range across every process of the host, so one exhausting a per-uid counter starves no neighbour."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from sandboxes.protocol import SandboxError
from sandboxes.uids import lease_uid, uid_lock_dir
from tests.sandboxes.conftest import BASE_SETTINGS

ROOT = Path(__file__).resolve().parents[2]

# Grabs every inotify instance its uid may have (fs.inotify.max_user_instances) and holds them.
INOTIFY_HOG = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while libc.inotify_init1(0) >= 0:
    n += 1
err = ctypes.get_errno()
open("/tmp/held", "w").write(f"{n} {err}")
time.sleep(float(sys.argv[1]))
"""
INOTIFY_ONE = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
print(fd, ctypes.get_errno())
"""
# Starts processes until fork fails, holds them a while (the agent cannot start a thread to serve
# anything meanwhile), then reports how many, the errno, and when it held them all.
FORK_HOG = r"""
import os, signal, sys, time
kids = []
while True:
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
full = time.time()
time.sleep(float(sys.argv[1]))
freed = time.time()
for pid in kids:
    os.kill(pid, signal.SIGKILL)
print(len(kids), err, full, freed)
"""


def _processes_of(uid: int) -> int:
    """How many processes of this host run as ``uid`` (the test shares the containers' kernel)."""
    n = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):  # exited meanwhile
            n += f"Uid:\t{uid}\t" in status.read_text()
    return n


async def _until_steady(uid: int) -> None:
    """Waits until the uid's process count stops growing (a hog at its limit)."""
    last, steady = -1, 0
    for _ in range(120):
        await asyncio.sleep(0.25)
        n = _processes_of(uid)
        steady = steady + 1 if n == last and n > 10 else 0
        if steady >= 4:
            return
        last = n
    raise AssertionError(f"uid {uid}'s processes never settled (last {last})")


def small_range() -> tuple[int, int]:
    """A range of 2 uids few other test runs will pick (a clash shows as a wrong count, not a leak)."""
    lo = random.randrange(1 << 20, 1 << 30)
    return lo, lo + 2


async def _held(sandbox) -> list[int]:
    """Waits for a hog in the sandbox to report what it holds: how many, and the errno that stopped it."""
    for _ in range(300):
        try:
            return [int(x) for x in (await sandbox.read_file("/tmp/held")).split()]
        except FileNotFoundError:
            await asyncio.sleep(0.1)
    raise AssertionError("the hog never reported")


async def test_inotify_exhaustion_does_not_reach_a_neighbour(make_sandbox):
    a = await make_sandbox()
    b = await make_sandbox()
    assert a.uid != b.uid
    await a.write_file("/tmp/hog.py", INOTIFY_HOG.encode())
    hog = asyncio.create_task(a.exec(["python3", "/tmp/hog.py", "20"], timeout=40))
    n, err = await _held(a)
    limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    assert err == 24 and 0 < n <= limit, (n, err)  # EMFILE: the uid's instances are all taken
    r = await a.exec(["python3", "-c", INOTIFY_ONE])
    assert r.stdout.split()[0] == b"-1", f"precondition: A itself is out of instances: {r}"
    r = await b.exec(["python3", "-c", INOTIFY_ONE])
    assert int(r.stdout.split()[0]) >= 0, f"the neighbour could not create an inotify instance: {r}"
    hog.cancel()


async def test_process_limit_is_per_sandbox(make_sandbox):
    """RLIMIT_NPROC counts the processes of a uid host-wide: A at its limit, B still forks."""
    a = await make_sandbox(pids_limit=48)
    b = await make_sandbox(pids_limit=48)
    r = await a.exec(["sh", "-c", "grep -i 'max processes' /proc/self/limits"])
    assert r.stdout.split()[2:4] == [b"48", b"48"], r
    await a.write_file("/tmp/hog.py", FORK_HOG.encode())
    hog = asyncio.create_task(a.exec(["python3", "/tmp/hog.py", "15"], timeout=60))
    await _until_steady(a.uid)
    started = time.time()
    r = await b.exec(["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 0.2 & done; wait; echo forked"])
    ended = time.time()
    assert r.exit_code == 0 and r.stdout.strip() == b"forked", r
    n, err, full, freed = (await hog).stdout.split()
    assert int(err) == 11 and 0 < int(n) < 48, (n, err)  # EAGAIN: A's uid is at its limit
    assert float(full) <= started and ended <= float(freed), "B ran while A held every process it may"


async def test_live_sandboxes_have_distinct_uids_returned_on_removal(make_sandbox):
    settings = BASE_SETTINGS.replace(uid_range=small_range())
    a = await make_sandbox(settings)
    b = await make_sandbox(settings)
    assert {a.uid, b.uid} == set(range(*settings.uid_range))
    with pytest.raises(SandboxError, match="no free sandbox uid"):
        await make_sandbox(settings)
    gone = a.uid
    await a.close()
    c = await make_sandbox(settings)
    assert c.uid == gone
    assert (await c.exec("id -u")).stdout.strip() == str(gone).encode()


async def test_an_orphan_container_keeps_its_uid(make_sandbox, docker_api):
    """A container left by a dead owner still runs as its uid: its label keeps the uid out of the pool."""
    settings = BASE_SETTINGS.replace(uid_range=small_range())
    a = await make_sandbox(settings)
    a._uid_lease.release()  # as a crashed owner's lock goes while its container lives on
    b = await make_sandbox(settings)
    assert b.uid != a.uid
    with pytest.raises(SandboxError, match="no free sandbox uid"):
        await make_sandbox(settings)


HOLDER = """
import sys
from sandboxes.uids import lease_uid
lo, hi = int(sys.argv[1]), int(sys.argv[2])
held = [lease_uid(lo, hi) for _ in range(int(sys.argv[3]))]
print(" ".join(str(x.uid) for x in held), flush=True)
sys.stdin.read()  # holds them until the test closes stdin or kills this process
"""


def test_pools_in_two_processes_never_share_a_uid(tmp_path, monkeypatch):
    """Two processes with different PQRL_CACHE lease from the host's one lock directory (the
    default one here): neither ever holds a uid the other holds."""
    lo = random.randrange(1 << 20, 1 << 30)  # far from any real range: no other test's uids
    hi = lo + 4
    monkeypatch.delenv("PQRL_SANDBOX_UID_DIR", raising=False)
    monkeypatch.setenv("PQRL_CACHE", str(tmp_path / "mine"))
    env = {**os.environ, "PQRL_CACHE": str(tmp_path / "theirs"), "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER), str(lo), str(hi), "3"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)  # fmt: skip
    try:
        theirs = {int(x) for x in child.stdout.readline().split()}
        assert len(theirs) == 3 and theirs <= set(range(lo, hi)), theirs
        mine = lease_uid(lo, hi)
        assert mine.uid not in theirs
        with pytest.raises(SandboxError, match="no free sandbox uid"):
            lease_uid(lo, hi)
        child.kill()  # a crashed process: the kernel drops its locks, its uids return
        child.wait(timeout=10)
        again = [lease_uid(lo, hi) for _ in range(3)]
        assert {x.uid for x in again} == theirs
        mine.release()
        assert lease_uid(lo, hi).uid == mine.uid
    finally:
        child.kill()
        child.wait(timeout=10)
    assert not (tmp_path / "mine" / "sandbox-uids").exists()
    for uid in range(lo, hi):  # in the host's directory, not under either cache
        (uid_lock_dir() / f"{uid}.lock").unlink()


def test_an_unsafe_lock_directory_is_refused_with_the_fix(tmp_path, monkeypatch):
    """A lock directory someone else could change is never used: another user's, writable by
    others, a link, not creatable, or relative (each process would have its own); each is a
    SandboxError that names the fix."""
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    os.chown(other, 54321, 54321)  # the tests run as root; a non-root run cannot set this up
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "target", target_is_directory=True)
    (tmp_path / "target").mkdir(mode=0o700)
    a_file = tmp_path / "file"
    a_file.write_text("")
    for path, why in [
        (other, "belongs to uid 54321"),
        (shared, "writable by others"),
        (link, "not a directory"),
        (a_file / "locks", "cannot create"),
        (Path("relative/locks"), "not an absolute path"),
    ]:
        monkeypatch.setenv("PQRL_SANDBOX_UID_DIR", str(path))
        with pytest.raises(SandboxError, match=why) as raised:
            lease_uid(1 << 30, (1 << 30) + 2)
        assert "PQRL_SANDBOX_UID_DIR" in str(raised.value)
    fresh = tmp_path / "fresh" / "locks"
    monkeypatch.setenv("PQRL_SANDBOX_UID_DIR", str(fresh))
    assert lease_uid(1 << 30, (1 << 30) + 2).held
    assert stat.S_IMODE(fresh.stat().st_mode) & 0o077 == 0


def test_a_planted_link_as_lock_file_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    (locks / "7.lock").symlink_to(target)
    with pytest.raises(SandboxError, match="7.lock"):
        lease_uid(7, 8, lock_dir=locks)
    assert not target.exists()


LEASE_ONE = """
from sandboxes.protocol import SandboxError
from sandboxes.uids import lease_uid
try:
    lease_uid(1 << 30, (1 << 30) + 2)
except SandboxError as e:
    print(e)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/python3").exists(), reason="needs root and a system Python"
)
def test_a_lock_directory_its_user_cannot_write_is_refused():
    """A process of an unprivileged user (a system Python: the tests' own lives under /root) whose
    lock directory is its own but read-only gets the error that names the fix."""
    base = Path(tempfile.mkdtemp(prefix="pqrl-uid-test-"))
    try:
        base.chmod(0o711)
        locks = base / "locks"
        locks.mkdir(mode=0o500)
        os.chown(locks, 65534, 65534)
        env = {"PQRL_SANDBOX_UID_DIR": str(locks), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
        out = subprocess.run(["/usr/bin/python3", "-c", LEASE_ONE], env=env, user=65534, group=65534,
                             extra_groups=[], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "is not writable" in out.stdout and "PQRL_SANDBOX_UID_DIR" in out.stdout, out.stdout
        assert list(locks.iterdir()) == []
    finally:
        shutil.rmtree(base)
