"""DockerSandbox: one hardened container per rollout, driven through the in-container exec agent."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import itertools
import json
import logging
import os
import socket
import tarfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pqrl.finite import finite
from pqrl.text import clipped
from sandboxes import agent
from sandboxes.docker_api import AttachStream, DockerAPI
from sandboxes.hardening import SandboxSettings
from sandboxes.protocol import ExecResult, SandboxCallFailed, SandboxDied, SandboxError, SandboxFlooded
from sandboxes.uids import UID_LABEL, UidLease, lease_uid

__all__ = ["AGENT_SOURCE", "DockerSandbox", "owner_id"]

log = logging.getLogger(__name__)

AGENT_SOURCE = Path(agent.__file__).read_text()
_REPLY_SLACK_S = 10.0  # how much longer than a command's timeout the host waits for the agent


class _CallErrors:
    """An error the agent answers for a call is that builtin type (what callers catch) and a
    SandboxCallFailed (so a caller can tell a failed sandbox call from its own bug), under the
    builtin's name; held here so each pickles by its qualified name."""


_ERRORS: dict[str, type[Exception]] = {}
for _base in (
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    FileExistsError,
    ValueError,
    OSError,  # read-only filesystem, disk full: the model's doing, not infrastructure
):
    _name = _base.__name__
    _ERRORS[_name] = type(
        _name, (_base, SandboxCallFailed), {"__module__": __name__, "__qualname__": f"_CallErrors.{_name}"}
    )
    setattr(_CallErrors, _name, _ERRORS[_name])
_MESSAGE_CHARS = 500  # of an agent's error message, as the call's exception carries it


def _process_start_ticks(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # field 22: start time in clock ticks
    except (OSError, IndexError):
        return "0"


def owner_id(pid: int | None = None) -> str:
    """host:pid:start-ticks of a process, so a reused pid is not mistaken for the owner."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_process_start_ticks(pid)}"


_LINE_SLACK = 16 << 10  # JSON framing around a reply's payload; the whole ready line


def _under_command(exc: Exception) -> Exception:
    """The death as a command in flight sees it: the agent's doing when the container's own state
    says it stopped (an exit code), not when it vanished (the engine went away)."""
    if isinstance(exc, SandboxDied) and exc.exit_code is not None:
        return SandboxDied(str(exc), oom_killed=exc.oom_killed, exit_code=exc.exit_code, agent_caused=True)
    return exc


def _call_error(op: str, reply: dict[str, Any], fields: dict[str, Any]) -> str:
    """The message of a failed call, naming the call and its path: bounded and encodable,
    whatever the caller passed or the agent echoed into it."""
    target = fields.get("path") or fields.get("dest") or fields.get("cwd")
    call = f"{op} {clipped(repr(target), 160)}" if isinstance(target, str) else op
    return clipped(f"{call} in sandbox: {reply.get('error')}: {reply.get('message')}", _MESSAGE_CHARS)


def _reply_bound(op: str, fields: dict[str, Any], output_cap: int) -> int:
    """The longest reply line a call may get: its payload's limit in base64, plus framing."""
    payload = {
        "exec": 2 * output_cap,
        "read_file": fields.get("max_bytes", 0),
        "download": fields.get("max_bytes", 0),
    }
    return 4 * payload.get(op, 0) // 3 + 4 + _LINE_SLACK


def _unsafe_agent(ready: dict[str, Any]) -> str | None:
    """Why an agent's ready line makes the sandbox unsafe to use, or None. Fails closed: the host
    channel is safe from forged replies only if the agent is pid 1 (nothing else holds it) and
    undumpable (nothing can open it through /proc/1/fd)."""
    if ready.get("undumpable") is not True:
        return "the exec agent could not make itself undumpable, so commands could forge its replies"
    if ready.get("pid") != 1:
        return f"the exec agent is pid {ready.get('pid')}, not 1: pid 1 holds the host channel too"
    return None


async def _lease_uid(api: DockerAPI, settings: SandboxSettings) -> UidLease:
    """A uid no live sandbox holds: unlocked on this host, and on no container of the engine
    (an orphan whose owner died still runs as its uid until the reaper removes it)."""
    taken = set()
    for c in await api.list([UID_LABEL], all=True):
        with contextlib.suppress(ValueError, TypeError):
            taken.add(int((c.get("Labels") or {}).get(UID_LABEL, "")))
    lo, hi = settings.uid_range
    return lease_uid(lo, hi, skip=taken)


class DockerSandbox:
    """A running container with the exec agent attached. Create with ``DockerSandbox.create``."""

    def __init__(
        self,
        api: DockerAPI,
        cid: str,
        stream: AttachStream,
        settings: SandboxSettings,
        uid_lease: UidLease | None = None,
    ) -> None:
        self.api = api
        self.id = cid
        self.settings = settings
        self._uid_lease = uid_lease  # returned to the pool once the container is gone
        self._stream = stream
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._calls: dict[int, tuple[str, int]] = {}  # request id -> (op, longest reply line it may get)
        self._ready = asyncio.get_running_loop().create_future()
        self._died: SandboxDied | None = None
        self._closed = False
        self._stderr_tail = b""
        self._oom_kills_seen = 0  # commands the OOM killer hit while the agent survived
        self._reader = asyncio.create_task(self._read_loop(), name=f"sandbox-{cid[:12]}")

    @classmethod
    async def create(
        cls,
        api: DockerAPI,
        settings: SandboxSettings | None = None,
        *,
        run: str = "default",
        session: str | None = None,
        ready_timeout: float = 30.0,
    ) -> DockerSandbox:
        """Creates, starts and attaches a container; removed again if any step fails."""
        settings = settings or SandboxSettings()
        labels = {
            "pqrl.run": run,
            "pqrl.session": session or uuid.uuid4().hex,
            "pqrl.owner": owner_id(),
            "pqrl.expires": str(int(time.time() + settings.lifetime_s)),
        }
        lease = await _lease_uid(api, settings) if not settings.user else None
        try:
            if lease is not None:
                labels[UID_LABEL] = str(lease.uid)
            uid = lease.uid if lease is not None else None
            config = settings.container_config(
                cmd=["python3", "-u", "-c", AGENT_SOURCE], labels=labels, uid=uid
            )
            cid = await api.create(f"pqrl-{uuid.uuid4().hex[:16]}", config)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        sandbox = None
        try:
            stream = await api.attach(cid)
            sandbox = cls(api, cid, stream, settings, lease)
            await api.start(cid)
            await asyncio.wait_for(asyncio.shield(sandbox._ready), ready_timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                if sandbox is not None:
                    await sandbox.close()  # stream, reader task, container and uid
                else:
                    await api.remove(cid)
            if sandbox is None and lease is not None:
                lease.release()
            raise
        return sandbox

    async def __aenter__(self) -> DockerSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def uid(self) -> int | None:
        """The uid leased to this sandbox (None when ``settings.user`` names a fixed user)."""
        return self._uid_lease.uid if self._uid_lease is not None else None

    @property
    def alive(self) -> bool:
        return self._died is None and not self._closed

    # ---------------------------------------------------------------- the protocol

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float = 30.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        if not isinstance(cmd, str) and (not cmd or not all(isinstance(a, str) for a in cmd)):
            raise ValueError(f"cmd must be a string or a non-empty list of strings, got {cmd!r}")
        timeout = finite(timeout, "timeout")  # NaN passes every comparison: waits forever
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        timeout = min(timeout, self.settings.lifetime_s)  # no command outlives its container
        reply = await self._call(
            "exec",
            timeout + _REPLY_SLACK_S,
            cmd=cmd if isinstance(cmd, str) else list(cmd),
            timeout=timeout,
            cwd=cwd,
            env=dict(env or {}),
            stdin=base64.b64encode(stdin).decode() if stdin else None,
            cap=self.settings.output_cap,
        )
        self._oom_kills_seen += bool(reply["oom_killed"])
        return ExecResult(
            stdout=base64.b64decode(reply["stdout"]),
            stderr=base64.b64decode(reply["stderr"]),
            exit_code=reply["exit_code"],
            timed_out=reply["timed_out"],
            truncated=reply["truncated"],
            duration=reply["duration"],
            oom_killed=reply["oom_killed"],
        )

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await self._call("write_file", 60.0, path=path, data=base64.b64encode(data).decode(), mode=mode)

    async def read_file(self, path: str, *, max_bytes: int = 16 << 20) -> bytes:
        reply = await self._call("read_file", 60.0, path=path, max_bytes=max_bytes)
        return base64.b64decode(reply["data"])

    async def upload(self, src: str | Path | bytes, dest: str) -> None:
        if isinstance(src, bytes):
            archive = src
        else:
            buf = io.BytesIO()
            src = Path(src)
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(src, arcname="." if src.is_dir() else src.name)
            archive = buf.getvalue()
        await self._call("upload", 120.0, dest=dest, tar=base64.b64encode(archive).decode())

    async def download(self, path: str, *, max_bytes: int = 64 << 20) -> bytes:
        reply = await self._call("download", 120.0, path=path, max_bytes=max_bytes)
        return base64.b64decode(reply["tar"])

    async def close(self) -> None:
        """Removes the container (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stream.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        self._fail_pending(SandboxError("sandbox closed"))
        try:
            await self.api.remove(self.id)
        finally:
            # a container that failed to go keeps its pqrl.uid label: later leases skip that uid
            if self._uid_lease is not None:
                self._uid_lease.release()

    # ---------------------------------------------------------------- agent protocol

    async def _call(self, op: str, wait: float, **fields: Any) -> dict[str, Any]:
        if self._died is not None:
            raise self._died
        if self._closed:
            raise SandboxError(f"sandbox {self.id[:12]} is closed")
        rid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._calls[rid] = (op, _reply_bound(op, fields, self.settings.output_cap))
        try:
            line = json.dumps({"id": rid, "op": op, **fields}, allow_nan=False)  # the agent trusts numbers
            await self._stream.write(line.encode() + b"\n")
            reply = await asyncio.wait_for(fut, wait)
        except TimeoutError:
            raise SandboxError(
                f"sandbox {self.id[:12]}: the agent did not answer {op} within {wait:.0f}s"
            ) from None
        except (ConnectionError, OSError) as e:
            raise self._died or SandboxError(f"sandbox {self.id[:12]}: stdio lost: {e}") from e
        finally:
            self._pending.pop(rid, None)
            self._calls.pop(rid, None)
        if not reply.get("ok"):
            # the agent is alive and answered: whatever failed is this call's, never the sandbox's
            raise _ERRORS.get(str(reply.get("error")), SandboxCallFailed)(_call_error(op, reply, fields))
        return reply

    async def _read_loop(self) -> None:
        buf = bytearray()
        scanned = 0  # bytes of buf known to hold no newline: big replies arrive in many frames
        try:
            while True:
                kind, payload = await self._stream.read_frame()
                if kind == 2:
                    self._stderr_tail = (self._stderr_tail + payload)[-4096:]
                    continue
                buf += payload
                while (end := buf.find(b"\n", scanned)) >= 0:
                    self._dispatch(json.loads(buf[:end]))
                    del buf[: end + 1]
                    scanned = 0
                scanned = len(buf)
                # a line can only be a reply to a pending call: no more than the largest of them may get
                limit = max((bound for _, bound in self._calls.values()), default=_LINE_SLACK)
                if len(buf) > limit:
                    raise SandboxFlooded(
                        f"sandbox {self.id[:12]}: {len(buf)} bytes without a newline on the host channel "
                        f"(at most {limit} expected): something in the sandbox writes to it"
                    )
        except EOFError:
            pass
        except SandboxFlooded as e:
            log.warning("%s; removing it", e)
            self._died = e
            self._fail_pending(e)
            with contextlib.suppress(Exception):
                await self.api.remove(self.id)
            return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a garbled stream is as fatal as a dead container
            log.error("sandbox %s: reader failed: %r", self.id[:12], e)
        if not self._closed:
            self._died = await self._why_dead()
            if not self._ready.done():
                self._ready.set_exception(self._died)
            self._fail_pending(self._died)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if msg.get("ready"):
            if not self._ready.done():
                refusal = _unsafe_agent(msg)
                if refusal:
                    self._ready.set_exception(SandboxError(f"sandbox {self.id[:12]}: {refusal}"))
                else:
                    self._ready.set_result(None)
            return
        fut = self._pending.get(msg.get("id", -1))
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _fail_pending(self, exc: Exception) -> None:
        for rid, fut in self._pending.items():
            if not fut.done():
                in_command = self._calls.get(rid, ("", 0))[0] == "exec"
                fut.set_exception(_under_command(exc) if in_command else exc)

    async def _why_dead(self) -> SandboxDied:
        tail = self._stderr_tail.decode(errors="replace").strip()[-500:]
        try:
            state = (await self.api.inspect(self.id))["State"]
        except Exception as e:
            return SandboxDied(f"sandbox {self.id[:12]} vanished ({e}); agent stderr: {tail!r}")
        # Docker's OOMKilled stays set after any OOM kill in the container, also one the agent
        # survived (and reported), so it names the cause only when no such kill was seen.
        code = state.get("ExitCode")
        oom = bool(state.get("OOMKilled")) and not self._oom_kills_seen and code != 3
        if code == 3:
            reason = f"its lifetime of {self.settings.lifetime_s:.0f}s expired"
        elif oom:
            reason = "its exec agent was OOM-killed (memory limit reached)"
        else:
            reason = f"the container stopped (status {state.get('Status')}, exit code {code})"
        return SandboxDied(
            f"sandbox {self.id[:12]} died: {reason}; agent stderr: {tail!r}", oom_killed=oom, exit_code=code
        )
