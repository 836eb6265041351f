"""The coding grader's in-container test runner (standard library only; uploaded for every grading).

Run as ``python3 -I -B runner.py`` with a JSON config on stdin (``argv``, ``cwd``, ``env``,
``timeout``, ``report_dir``). It:

1. makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``), so other processes of the same
   user (the code under test) cannot open its ``/proc/<pid>/fd``, read its memory or ptrace it;
2. starts pytest (``argv``, with ``{junit}`` replaced by ``/dev/fd/N``) in a new session, with the
   write ends of two pipes as its only extra file descriptors: the JUnit XML goes into one and
   exists nowhere on disk, so no path can be overwritten afterwards, and a second write (an exit
   hook appending a forged report) makes the document malformed; the rewritten tests' probe
   record (tasks/coding/probes.py) goes into the other (``PQRL_PROBE_FD``);
3. after pytest exits (or times out), kills its process group and then every other process but
   itself, its parent (the exec agent) and init, counting what it had to kill beyond the group;
4. only then creates ``report_dir`` (exclusively: a directory planted in advance fails the run)
   and writes ``report.json`` there with the XML, pytest's exit status and these counts.

The host reads ``report.json`` through the sandbox API and judges it; nothing here decides a
reward, and pytest's stdout is kept only as an untrusted tail for debugging.
"""

import base64
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time

MAX_XML = 2 << 20
MAX_PROBES = 8 << 20
MAX_OUTPUT = 16 << 10
GRACE_S = 2.0  # after pytest exits: how long to wait for the pipes to reach end-of-file


def undumpable() -> bool:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE = 4
    except Exception:
        return False


def sweep(keep: set) -> int:
    """Kills every process whose pid is not in ``keep``; returns how many it signalled."""
    killed = 0
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in keep:
            try:
                os.kill(int(name), signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def start_pytest(config: dict, xml_w: int, probe_w: int, out_w: int) -> subprocess.Popen:
    """pytest in a new session, the JUnit XML into ``xml_w`` and the probe record into ``probe_w``
    (its only extra descriptors), its output into ``out_w``; the write ends are closed here, so
    the pipes reach end-of-file when pytest and its children are gone."""
    argv = [a.replace("{junit}", f"/dev/fd/{xml_w}") for a in config["argv"]]
    child = subprocess.Popen(
        argv,
        cwd=config["cwd"],
        env={**config["env"], "PQRL_PROBE_FD": str(probe_w)},
        stdin=subprocess.DEVNULL,
        stdout=out_w,
        stderr=out_w,
        pass_fds=(xml_w, probe_w),
        start_new_session=True,
    )
    for fd in (xml_w, probe_w, out_w):
        os.close(fd)
    return child


def stop(child: subprocess.Popen) -> int:
    """Kills pytest's process group, then every other process; returns how many escaped the group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    # Whatever still runs escaped pytest's process group: it may hold the report pipe.
    return sweep({1, os.getpid(), os.getppid()})


def store(buf: bytearray, chunk: bytes, limit: "int | None") -> bool:
    """Adds ``chunk`` to its pipe's buffer; False when it would take the buffer past ``limit``
    (the chunk is dropped, so an oversized report is flagged rather than cut and parsed). The
    output (``limit`` None) keeps its last ``MAX_OUTPUT`` bytes."""
    if limit is None:
        buf += chunk
        del buf[: max(0, len(buf) - MAX_OUTPUT)]
    elif len(buf) + len(chunk) > limit:
        return False
    else:
        buf += chunk
    return True


def collect(child: subprocess.Popen, deadline: float, pipes: dict) -> dict:
    """Reads the pipes (name -> (read fd, byte limit or None)) until pytest has exited (or timed
    out, then it is killed) and they reach end-of-file, at most ``GRACE_S`` after that; returns
    what the run left for the report."""
    names = {fd: name for name, (fd, _) in pipes.items()}
    buffers = {name: bytearray() for name in pipes}
    overflow = set()
    sel = selectors.DefaultSelector()
    for fd in names:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    timed_out = False
    exited_at = None
    leftovers = 0
    while True:
        now = time.monotonic()
        if exited_at is None and (child.poll() is not None or now >= deadline):
            timed_out = child.poll() is None
            exited_at = now
            leftovers = stop(child)
        if exited_at is not None and (not sel.get_map() or now - exited_at > GRACE_S):
            break
        if not sel.get_map():  # every pipe closed; pytest is still exiting
            time.sleep(0.01)
            continue
        for key, _ in sel.select(timeout=0.05):
            try:
                chunk = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(key.fd)
                continue
            name = names[key.fd]
            # after one dropped chunk nothing more is kept: later chunks would splice a record
            # that parses with entries missing from its middle
            if name in overflow or not store(buffers[name], chunk, pipes[name][1]):
                overflow.add(name)
    pipe_open = bool(sel.get_map())
    sel.close()
    return {
        **{name: bytes(buf) for name, buf in buffers.items()},
        "overflow": sorted(overflow),
        "timed_out": timed_out,
        "exited_at": exited_at,
        "leftovers": leftovers,
        "pipe_open": pipe_open,
    }


def write_report(report_dir: str, report: dict) -> int:
    """Creates ``report_dir`` exclusively and writes ``report.json`` in it; 3 when it existed."""
    try:
        os.mkdir(report_dir, 0o700)
        fd = os.open(os.path.join(report_dir, "report.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        print("report directory already exists", file=sys.stderr)
        return 3
    with os.fdopen(fd, "w") as f:
        json.dump(report, f)
    return 0


def main() -> int:
    config = json.loads(sys.stdin.read())
    dumpable_off = undumpable()
    xml_r, xml_w = os.pipe()
    probe_r, probe_w = os.pipe()
    out_r, out_w = os.pipe()
    started = time.monotonic()
    child = start_pytest(config, xml_w, probe_w, out_w)
    pipes = {"xml": (xml_r, MAX_XML), "probes": (probe_r, MAX_PROBES), "output": (out_r, None)}
    run = collect(child, started + float(config["timeout"]), pipes)
    report = {
        "xml": base64.b64encode(run["xml"]).decode(),
        "xml_overflow": "xml" in run["overflow"],
        "probes": base64.b64encode(run["probes"]).decode(),
        "probes_overflow": "probes" in run["overflow"],
        "exit_code": child.returncode,
        "timed_out": run["timed_out"],
        "duration_s": round((run["exited_at"] or time.monotonic()) - started, 3),
        "leftover_processes": run["leftovers"],
        "pipe_open": run["pipe_open"],
        "dumpable_off": dumpable_off,
        "output_tail": run["output"].decode("utf-8", "replace"),
    }
    return write_report(config["report_dir"], report)


if __name__ == "__main__":
    sys.exit(main())
