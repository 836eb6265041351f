"""The Sandbox protocol: the five calls an environment needs, and the errors they raise.

Intentionally small. Backends (Docker today) implement it; environments and graders depend on
this module only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = [
    "ExecResult",
    "ImageMissing",
    "Sandbox",
    "SandboxCallFailed",
    "SandboxDied",
    "SandboxError",
    "SandboxUnavailable",
]

Command = str | Sequence[str]


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What one command did. Output beyond the cap is cut and ``truncated`` is set."""

    stdout: bytes
    stderr: bytes
    exit_code: int  # -N when killed by signal N (e.g. -9 on timeout or OOM kill)
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0  # seconds, measured inside the sandbox
    oom_killed: bool = False  # the kernel's OOM killer fired in the sandbox during this command

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def text(self, errors: str = "replace") -> str:
        """stdout then stderr as text, for showing to a model."""
        return (self.stdout + self.stderr).decode("utf-8", errors)


class SandboxError(RuntimeError):
    """Base class: the sandbox failed. ``agent_caused`` says whether the agent's own commands did it
    (then the episode scores 0 with the cause recorded); otherwise it is an infrastructure failure
    (the rollout records ``failed_infra``)."""

    agent_caused = False


class SandboxCallFailed(Exception):
    """The sandbox's agent answered that this one call failed. An error with a closer builtin type
    (a missing file, a path too long) is raised as that type too, so ``except FileNotFoundError``
    still catches it; one without (an archive that is not one) is only this. Not a
    ``SandboxError``: the sandbox is alive and serves the next call, so the call's failure is its
    caller's (a tool's: an error message to the model; an environment's reset: its own error)."""


class SandboxUnavailable(SandboxError):
    """The container engine cannot be reached."""


class ImageMissing(SandboxError):
    """The sandbox image is not present in the engine."""


class SandboxFlooded(SandboxError):
    """Something in the sandbox wrote more to the host channel than the pending calls can answer:
    the container is removed, the call fails. Commands cannot reach the channel (only the agent,
    pid 1 and undumpable, holds it), so this is the second line of defence."""

    agent_caused = True


class SandboxDied(SandboxError):
    """The container stopped (OOM kill of the agent, lifetime expired, killed, removed).

    ``agent_caused`` when it stopped while running one of the agent's commands and its own state
    says how (memory no process owns, such as a memfd, gets the agent OOM-killed): not when it was
    found dead before a call, or gone.
    """

    def __init__(
        self,
        message: str,
        *,
        oom_killed: bool = False,
        exit_code: int | None = None,
        agent_caused: bool = False,
    ) -> None:
        super().__init__(message)
        self.oom_killed = oom_killed
        self.exit_code = exit_code
        self.agent_caused = agent_caused


@runtime_checkable
class Sandbox(Protocol):
    """An isolated machine for one rollout. Paths are inside the sandbox."""

    async def exec(
        self,
        cmd: Command,
        *,
        timeout: float = 30.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Runs ``cmd`` (a string for the shell, or an argv list) in its own process group.
        ``timeout`` must be a finite number of seconds > 0 (ValueError otherwise, before anything
        runs); a backend may cut it to the sandbox's lifetime."""
        ...

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, *, max_bytes: int = 16 << 20) -> bytes: ...

    async def upload(self, src: str | Path | bytes, dest: str) -> None:
        """Copies a local directory, or a tar archive given as bytes, into ``dest``."""
        ...

    async def download(self, path: str, *, max_bytes: int = 64 << 20) -> bytes:
        """A tar archive of ``path`` (a file or a directory), refused when larger than ``max_bytes``."""
        ...

    async def close(self) -> None: ...
