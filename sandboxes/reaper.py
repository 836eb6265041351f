"""Reaper: removes pqrl containers whose owner process is gone or whose lifetime has expired.

Every sandbox container carries ``pqrl.owner`` (host:pid:process-start-ticks of the process that
made it) and ``pqrl.expires`` (epoch seconds). A pass lists all such containers in any state,
*Created* and *Exited* included, and force-removes those whose owner on this host no longer runs
(or is a different process with a reused pid) and those past their expiry. Owners on other hosts
cannot be checked from here, so their containers go only when they expire.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator

from pqrl.finite import finite
from sandboxes.docker_api import DockerAPI

__all__ = ["owner_alive", "reap", "reap_every"]

log = logging.getLogger(__name__)


def owner_alive(owner: str) -> bool:
    """Whether the process named by a ``pqrl.owner`` label still runs (True if not checkable)."""
    from sandboxes.docker import owner_id

    try:
        host, pid_text, _ = owner.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return False  # a malformed label has no owner to protect it
    if host != socket.gethostname():
        return True
    if not os.path.exists(f"/proc/{pid}"):
        return False
    return owner_id(pid) == owner


async def reap(api: DockerAPI, *, now: float | None = None) -> list[str]:
    """One pass; returns the ids of the containers removed."""
    now = time.time() if now is None else now
    removed = []
    for c in await api.list(["pqrl.owner"], all=True):
        labels = c.get("Labels") or {}
        try:
            expired = now > finite(labels.get("pqrl.expires", "0"))  # "nan" would never expire
        except ValueError:
            expired = True
        orphaned = not owner_alive(labels.get("pqrl.owner", ""))
        if expired or orphaned:
            why = "expired" if expired else "owner gone"
            log.info("reaping sandbox %s (%s, state %s)", c["Id"][:12], why, c.get("State"))
            await api.remove(c["Id"])
            removed.append(c["Id"])
    return removed


async def reap_every(api: DockerAPI, every_s: float) -> AsyncIterator[int]:
    """A pass every ``every_s`` seconds, forever; yields how many each removed. A failed pass is
    logged and the next one runs on time: one Docker hiccup must not end reaping for good."""
    while True:
        await asyncio.sleep(every_s)
        try:
            yield len(await reap(api))
        except Exception as e:
            log.warning("reaper pass failed: %s", e)
