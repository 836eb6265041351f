"""Sandbox limits and hardened defaults (no network, no capabilities, not root, read-only root
filesystem, capped resources) that loosen only when asked by name."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SECURITY_FIELDS", "SandboxSettings"]

# Fields whose non-default value weakens isolation; each must be named in ``loosen`` to change.
SECURITY_FIELDS = ("network", "read_only_root", "user", "cap_add", "no_new_privileges", "pids_limit")


_MIN_POOL_UID = 65_536  # below: the host's own users and groups
_MAX_UID = 1 << 31


@dataclass(frozen=True)
class SandboxSettings:
    """How a rollout's container is run. Equal settings share one warm pool.

    Resource limits may be tightened freely. Anything in ``SECURITY_FIELDS`` may differ from its
    default only when its name is in ``loosen`` (e.g. ``SandboxSettings(network=True,
    loosen=frozenset({"network"}))``), so no environment opens the network by accident.
    """

    image: str = "pqrl-sandbox-base:latest"
    memory_mb: int = 1024  # memory + swap; tmpfs contents count toward it
    cpus: float = 1.0
    pids_limit: int = 256
    nofile: int = 1024
    tmp_mb: int = 256  # size cap of the /tmp tmpfs
    workspace_mb: int = 512  # size cap of the /workspace tmpfs
    shm_mb: int = 16  # size cap of /dev/shm (also counts toward memory)
    lifetime_s: float = 3600.0  # hard limit: the container exits and the reaper removes it
    output_cap: int = 64 << 10  # bytes kept per stream per command
    network: bool = False
    read_only_root: bool = True
    # "" runs each sandbox as its own uid (and gid) leased from uid_range, so per-uid kernel
    # counters (inotify instances, RLIMIT_NPROC, message queues) are not shared between sandboxes;
    # "uid:gid" runs every sandbox as that one user.
    user: str = ""
    uid_range: tuple[int, int] = (200_000, 265_536)  # [lo, hi): above the host's own users
    cap_add: tuple[str, ...] = ()
    no_new_privileges: bool = True
    env: tuple[tuple[str, str], ...] = (("HOME", "/tmp"),)
    loosen: frozenset[str] = field(default=frozenset())

    def __post_init__(self) -> None:
        defaults = SandboxSettings.__dataclass_fields__
        unknown = set(self.loosen) - set(SECURITY_FIELDS)
        if unknown:
            raise ValueError(
                f"loosen names unknown security fields {sorted(unknown)}; known: {SECURITY_FIELDS}"
            )
        for name in SECURITY_FIELDS:
            default = defaults[name].default
            value = getattr(self, name)
            weaker = value > default if name == "pids_limit" else value != default
            if weaker and name not in self.loosen:
                raise ValueError(
                    f"SandboxSettings.{name}={value!r} weakens isolation (default {default!r}); "
                    f"add {name!r} to loosen to allow it"
                )
        for name in ("memory_mb", "pids_limit", "nofile", "tmp_mb", "workspace_mb", "shm_mb", "output_cap"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxSettings.{name} must be > 0")
        lo, hi = self.uid_range
        if not (_MIN_POOL_UID <= lo < hi <= _MAX_UID):
            raise ValueError(
                f"SandboxSettings.uid_range must satisfy {_MIN_POOL_UID} <= lo < hi <= {_MAX_UID}"
            )
        if not (0 < self.cpus < math.inf and 0 < self.lifetime_s < math.inf):  # NaN fails both
            raise ValueError("SandboxSettings.cpus and lifetime_s must be finite and > 0")

    def replace(self, **changes: Any) -> SandboxSettings:
        return dataclasses.replace(self, **changes)

    def container_config(
        self, *, cmd: list[str], labels: dict[str, str], uid: int | None = None
    ) -> dict[str, Any]:
        """The Docker Engine API body that creates a container with these settings, run as the
        leased ``uid`` (required when ``user`` is "")."""
        if not self.user and uid is None:
            raise ValueError("SandboxSettings.user is empty: the container needs a leased uid")
        user = self.user or f"{uid}:{uid}"
        owner, _, group = user.partition(":")
        if not (owner.isdigit() and (group or owner).isdigit()):  # a name: the image's own user
            owner = group = "1000"
        # a leased uid has no passwd entry: tools that ask who runs them (getpass) read these first
        given = {k for k, _ in self.env}
        named = [f"{k}=agent" for k in ("USER", "LOGNAME") if k not in given and not self.user]
        mem = self.memory_mb << 20
        ulimits = [{"Name": "nofile", "Soft": self.nofile, "Hard": self.nofile}]
        if not self.user:  # per-uid, and the uid is this sandbox's alone: no more than its pids
            ulimits.append({"Name": "nproc", "Soft": self.pids_limit, "Hard": self.pids_limit})
        host: dict[str, Any] = {
            "NetworkMode": "bridge" if self.network else "none",
            "CapDrop": ["ALL"],
            "CapAdd": list(self.cap_add),
            "SecurityOpt": ["no-new-privileges"] if self.no_new_privileges else [],
            "PidsLimit": self.pids_limit,
            "Memory": mem,
            "MemorySwap": mem,  # equal: no swap beyond the memory limit
            "NanoCpus": int(self.cpus * 1e9),
            "Ulimits": ulimits,
            "ReadonlyRootfs": self.read_only_root,
            "Tmpfs": {
                # exec: coding tasks run ./scripts and venv console scripts from here
                "/tmp": f"rw,exec,nosuid,nodev,size={self.tmp_mb}m,mode=1777",
                "/workspace": f"rw,exec,nosuid,nodev,size={self.workspace_mb}m,"
                f"uid={owner},gid={group or owner},mode=0755",
            },
            "ShmSize": self.shm_mb << 20,
            # No log driver: the agent's stdout carries every command's output, which must not
            # accumulate on the host's disk (json-file would keep it until removal, unbounded).
            "LogConfig": {"Type": "none", "Config": {}},
            # No docker-init: the exec agent is pid 1, the only process holding the host channel
            # (an init would hold it too, dumpable, and anything inside could forge replies through
            # /proc/1/fd/1); the agent reaps orphans itself.
            "Init": False,
            "IpcMode": "private",
        }
        return {
            "Image": self.image,
            "Entrypoint": [],  # the image's entrypoint would be pid 1 instead of the agent
            "Cmd": cmd,
            "User": user,
            "WorkingDir": "/workspace",
            "Env": [f"{k}={v}" for k, v in self.env] + [f"PQRL_LIFETIME={self.lifetime_s}"] + named,
            "Labels": labels,
            "AttachStdin": True,
            "AttachStdout": True,
            "AttachStderr": True,
            "OpenStdin": True,
            "StdinOnce": True,  # the agent sees EOF, and exits, when the host's attach closes
            "Tty": False,
            "NetworkDisabled": not self.network,
            "HostConfig": host,
        }
