"""The exec agent: runs inside every sandbox as its only long-lived process, pid 1.

Standard library only, Python >= 3.8, no network: the host talks to it over the container's
attached stdin/stdout, one JSON object per line each way, so a tool call costs a pipe round trip
instead of a ``docker exec`` (about 70 ms). Requests carry an ``id``; each runs in its own thread,
so several may be in flight. The source of this file is passed to ``python3 -c`` when the
container starts, so images need nothing but python3.

That stdin/stdout is the host channel, and whoever can write to it can forge replies. The agent
is pid 1 (no docker-init) so that it is the only process holding it, and it makes itself
undumpable, so no process of the same user can open ``/proc/1/fd``; it reports in its ready line
whether that worked, and the host refuses an agent that is dumpable. Commands get their own pipes.
Being pid 1 has two consequences: orphans are reparented to the agent, which reaps them (they
would count against the pids limit), and a signal from inside the sandbox reaches it only if it
has a handler for it, so it keeps none: ``kill -9 -1`` or ``kill -INT 1`` cannot end it.

Every command runs in its own process group (a new session); on timeout, and when the command
returns, the whole group is killed, and so is any process that left the group (setsid), so no
background process outlives its call. Output beyond the
cap is read and dropped inside the sandbox: the host never receives more than the cap per stream.
The agent exits, and the container with it, when the host closes stdin or the lifetime runs out.
"""

import base64
import contextlib
import io
import json
import os
import selectors
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time

_LOCK = threading.Lock()
_OUT = sys.stdout.buffer
_ACTIVE = set()  # process groups of the commands running now
_ACTIVE_LOCK = threading.Lock()
_GRACE_S = 0.05  # after the command exits, how long to drain pipes held open by its children
_POLL_S = 0.02  # while the command runs: how often to look whether it exited
_EXIT_WAIT_S = 1.0  # after its pipes closed, how long a command may take to exit before it is killed
_SETTLE_S = 0.5  # after a command, how long to wait for the processes killed with it to die
_REAP_EVERY_S = 0.5  # how often orphaned zombies are reaped between commands
_MESSAGE_CHARS = 400  # of an error message: it may echo a request's arguments (a 2 MB path)
_PATH_MAX = 4096  # bytes, Linux's PATH_MAX: longer paths are refused before any walk over them


def _send(msg):
    data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
    with _LOCK:
        _OUT.write(data)
        _OUT.flush()


def _b64(data):
    return base64.b64encode(data).decode("ascii")


def _clip(text):
    """An error message short enough for any reply line, whatever the request echoed into it."""
    if len(text) <= _MESSAGE_CHARS:
        return text
    return text[: _MESSAGE_CHARS - 40] + f"... ({len(text)} characters in all)"


def _path(req, key="path"):
    """The request's path, checked before use: a string the file system can name (no NUL, no
    lone surrogate, at most PATH_MAX bytes). A bad one is the call's error, not the agent's."""
    path = req.get(key)
    if not isinstance(path, str) or not path:
        raise ValueError(f"{key} must be a non-empty string")
    try:
        size = len(os.fsencode(path))
    except UnicodeError:
        raise ValueError(f"{key} is not valid UTF-8 text") from None
    if "\0" in path:
        raise ValueError(f"{key} contains a NUL character")
    if size >= _PATH_MAX:
        raise ValueError(f"{key} is {size} bytes long; at most {_PATH_MAX - 1} are allowed")
    return path


def _makedirs(path):
    """``os.makedirs(path, exist_ok=True)`` without recursion, so a path of thousands of components
    fails (or succeeds) as the call's own result instead of hitting the recursion limit."""
    missing = []
    head = os.path.join(os.getcwd(), path)  # not normalized: "link/.." means what the kernel says
    while not os.path.isdir(head):
        missing.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if not os.path.isdir(d):
                raise


def _oom_kills():
    """The cgroup's OOM-kill counter (cgroup v2 memory.events or v1 memory.oom_control)."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return 0


def _feed(pipe, data):
    with contextlib.suppress(OSError):  # the command may exit without reading its stdin
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def _kill_group(pid):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _stat(pid):
    """(state, ppid, pgrp) of a process from /proc/<pid>/stat; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def _pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _kill_strays():
    """Kills every process but the agent and the running commands' groups; returns how many were
    still alive (not zombies). Hold _ACTIVE_LOCK."""
    me, alive = os.getpid(), 0
    for pid in _pids():
        proc = _stat(pid)
        if pid != me and proc is not None and proc[0] != "Z" and proc[2] not in _ACTIVE:
            alive += 1
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return alive


def _sweep():
    """Kills every process that left its command's group (setsid, a daemon), so none outlives the
    command, and reaps them once dead: a burst of commands must not pile zombies up against the
    pids limit. Waits at most _SETTLE_S for them to die."""
    deadline = time.monotonic() + _SETTLE_S
    while True:
        with _ACTIVE_LOCK:
            alive = _kill_strays()
            _reap_orphans()
        if not alive or time.monotonic() >= deadline:
            return
        time.sleep(0.002)


def _reap_orphans():
    """Reaps the zombies the agent inherited as pid 1 (processes whose parent died): they would
    count against the pids limit. A command's leader is left to its Popen, which needs its exit
    status; the lock keeps a new one from starting unseen. Hold _ACTIVE_LOCK."""
    me = os.getpid()
    for pid in _pids():
        proc = _stat(pid)
        if proc is not None and proc[0] == "Z" and proc[1] == me and pid not in _ACTIVE:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _reap_forever():
    while True:
        time.sleep(_REAP_EVERY_S)
        with _ACTIVE_LOCK:
            _reap_orphans()


def _start(argv, cwd, env, with_stdin):
    """Starts the command in a new session and registers its process group; raises what Popen
    raises (the group is registered only once the command runs)."""
    with _ACTIVE_LOCK:  # a sweep must not see the child before its group is registered
        p = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        _ACTIVE.add(p.pid)
    return p


class _CappedOutput:
    """The command's stdout and stderr, read without blocking; each keeps its first ``cap`` bytes,
    the rest is read and dropped (``truncated``)."""

    def __init__(self, p, cap):
        self.cap = cap
        self.out_fd, self.err_fd = p.stdout.fileno(), p.stderr.fileno()
        self.bufs = {self.out_fd: bytearray(), self.err_fd: bytearray()}
        self.sel = selectors.DefaultSelector()
        for fd in self.bufs:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)
        self.truncated = False

    def take(self, fd):
        """Reads one chunk into the capped buffer; False at EOF or when nothing is there."""
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        if not chunk:
            self.sel.unregister(fd)
            return False
        buf = self.bufs[fd]
        room = self.cap - len(buf)
        if room > 0:
            buf += chunk[:room]
        if len(chunk) > room:
            self.truncated = True
        return True

    def drain(self):
        """Reads what the pipes still hold (bounded), then closes the selector."""
        for fd in list(self.sel.get_map()):  # what the command wrote before it exited is in the pipe now
            for _ in range(64):
                if not self.take(fd):
                    break
        self.sel.close()


def _pump(p, output, deadline):
    """Reads the command's output until it has exited and its pipes go quiet, or until the
    deadline (then its group is killed, and escaped children get one more second); returns
    whether it timed out."""
    sel = output.sel
    timed_out = False
    exited_at = last_data = None
    while sel.get_map():
        now = time.monotonic()
        if not timed_out and now >= deadline:
            _kill_group(p.pid)
            timed_out = True
            deadline = now + 1.0  # pipes of escaped children: stop waiting for them soon
        elif timed_out and now >= deadline:
            break
        if exited_at is None and p.poll() is not None:
            exited_at = now
        # After the command exits, wait for EOF only while output keeps coming (a background child
        # may hold the pipe open forever); a loaded machine may be slow to deliver the last bytes.
        if exited_at is not None and now - max(exited_at, last_data or exited_at) > _GRACE_S:
            break
        wait = deadline - now if exited_at is None else _GRACE_S
        # wake often enough to see the command exit while a background child keeps its pipe open
        for key, _ in sel.select(timeout=max(0.0, min(wait, _POLL_S))):
            if output.take(key.fd):
                last_data = time.monotonic()
    return timed_out


def _reap(p, timed_out):
    """Kills the command's group and every process that left it; returns the exit code."""
    if not timed_out:
        # a command may close its pipes just before it exits (cat does): let it finish so its own
        # exit code is reported, not the kill's
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=_EXIT_WAIT_S)
    _kill_group(p.pid)  # background children die with their command
    exit_code = p.wait()
    with _ACTIVE_LOCK:
        _ACTIVE.discard(p.pid)
    _sweep()
    for f in (p.stdout, p.stderr):
        f.close()
    return exit_code


def _timeout(value):
    """Seconds, refused unless a finite number > 0 (JSON's NaN fails both comparisons, Infinity and
    1e999 the second): otherwise the command would never time out and ``_pump`` would spin."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def op_exec(req):
    cmd = req["cmd"]
    argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    cap = int(req.get("cap", 65536))
    timeout = _timeout(req.get("timeout", 30.0))
    stdin = base64.b64decode(req["stdin"]) if req.get("stdin") else None
    env = dict(os.environ)
    env.update(req.get("env") or {})
    oom_before = _oom_kills()
    t0 = time.monotonic()
    try:
        p = _start(argv, req.get("cwd") or None, env, with_stdin=stdin is not None)
    except (OSError, ValueError) as e:
        return {
            "stdout": "",
            "stderr": _b64(_clip(str(e)).encode("utf-8", "backslashreplace")),
            "exit_code": 127,
            "timed_out": False,
            "truncated": False,
            "duration": time.monotonic() - t0,
            "oom_killed": False,
        }
    if stdin is not None:
        threading.Thread(target=_feed, args=(p.stdin, stdin), daemon=True).start()
    output = _CappedOutput(p, cap)
    timed_out = _pump(p, output, t0 + timeout)
    output.drain()
    exit_code = _reap(p, timed_out)
    return {
        "stdout": _b64(bytes(output.bufs[output.out_fd])),
        "stderr": _b64(bytes(output.bufs[output.err_fd])),
        "exit_code": exit_code,
        "timed_out": timed_out,
        "truncated": output.truncated,
        "duration": time.monotonic() - t0,
        "oom_killed": _oom_kills() > oom_before,
    }


def _open_regular(path, flags):
    """Opens ``path`` only if it is a regular file. Non-blocking, so a FIFO planted there cannot
    hang the call, and checked on the open descriptor, so a link to a device or to the agent's own
    stdin/stdout (``/dev/stdout``: the host channel) is refused before a byte moves."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY, 0o644)
    except OSError as e:
        if e.errno == 6:  # ENXIO: a FIFO without a reader, opened for writing
            raise ValueError(f"{path} is not a regular file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory", path)
        if not stat.S_ISREG(mode):
            raise ValueError(f"{path} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def op_write_file(req):
    path = _path(req)
    _makedirs(os.path.dirname(path) or ".")
    fd = _open_regular(path, os.O_WRONLY | os.O_CREAT)
    with os.fdopen(fd, "wb") as f:
        f.truncate(0)
        f.write(base64.b64decode(req["data"]))
        os.fchmod(fd, int(req.get("mode", 0o644)) & 0o777)
    return {}


def op_read_file(req):
    limit = int(req.get("max_bytes", 16 << 20))
    path = _path(req)
    with os.fdopen(_open_regular(path, os.O_RDONLY), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return {"data": _b64(data)}


def _inside(path, root):
    return path == root or path.startswith(root + os.sep)


def _check_member(m, root, dest):
    target = os.path.realpath(os.path.join(root, m.name))
    if not _inside(target, root):
        raise ValueError(f"archive member {m.name!r} would land outside {dest}")
    if m.isdev():
        raise ValueError(f"archive member {m.name!r} is a device file")
    if m.issym() or m.islnk():
        base = os.path.dirname(target) if m.issym() else root
        if not _inside(os.path.realpath(os.path.join(base, m.linkname)), root):
            raise ValueError(f"archive link {m.name!r} points outside {dest}")


def op_upload(req):
    """Extracts a tar into ``dest``. Every member is checked before anything is written, and again
    just before it is written, against the tree as it is then, so a chain of symlinks planted by
    earlier members cannot lead outside (the image's Python may predate tarfile's filters)."""
    dest = _path(req, "dest")
    _makedirs(dest)
    root = os.path.realpath(dest)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(req["tar"]))) as tar:
        members = tar.getmembers()
        for m in members:
            _check_member(m, root, dest)
        for m in members:
            _check_member(m, root, dest)
            m.mode &= 0o777  # no setuid/setgid bits
            if m.isdir():
                m.mode |= 0o700  # stay writable for the members that follow
            m.uid = m.gid = os.getuid()
            tar.extract(m, root, set_attrs=not m.issym())
    return {}


def op_download(req):
    path = _path(req)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(path, arcname=os.path.basename(path.rstrip("/")) or ".")
    limit = int(req.get("max_bytes", 64 << 20))
    if buf.tell() > limit:  # the host refuses longer replies
        raise ValueError(f"{path} archives to more than {limit} bytes")
    return {"tar": _b64(buf.getvalue())}


OPS = {
    "exec": op_exec,
    "write_file": op_write_file,
    "read_file": op_read_file,
    "upload": op_upload,
    "download": op_download,
}


def handle(req):
    rid = req.get("id")
    try:
        result = OPS[req["op"]](req)
        _send({"id": rid, "ok": True, **result})
    except Exception as e:  # every failure goes back to the host, typed by name, its message bounded
        _send({"id": rid, "ok": False, "error": type(e).__name__, "message": _clip(str(e))})


def _undumpable():
    """Makes the agent undumpable and says whether it is: otherwise processes of the same user could
    open /proc/<agent>/fd and forge replies on its stdout. Children get the flag back on exec."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
        return libc.prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE = 3
    except (OSError, AttributeError):
        return False


def _no_signal_handlers():
    """As pid 1 the agent gets only the signals it handles from inside the sandbox: drop Python's
    handlers (SIGINT's KeyboardInterrupt). SIG_DFL, not SIG_IGN, which commands would inherit."""
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)


def main():
    undumpable = _undumpable()
    _no_signal_handlers()
    lifetime = float(os.environ.get("PQRL_LIFETIME", "0") or 0)
    if lifetime > 0:
        timer = threading.Timer(lifetime, lambda: os._exit(3))
        timer.daemon = True
        timer.start()
    threading.Thread(target=_reap_forever, daemon=True).start()
    _send({"ready": True, "pid": os.getpid(), "undumpable": undumpable})
    for line in sys.stdin.buffer:
        try:
            req = json.loads(line)
        except ValueError:
            _send({"id": None, "ok": False, "error": "BadRequest", "message": "not JSON"})
            continue
        threading.Thread(target=handle, args=(req,), daemon=True).start()
    os._exit(0)  # stdin closed: the host is gone or closed the sandbox


if __name__ == "__main__":
    main()
