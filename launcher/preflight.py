"""Before a job leases its first task: the env servers are ready (their sandbox backend answers,
within the grace) and take the job's token, and every environment of its suites is known (there or
in this process). A permanent fault
found here stops the job with one line before anything of its task plan is spent."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from env_server.client import HttpEnvClient
from env_server.sessions import EnvServerError, UnknownEnv
from pqrl.errors import PermanentFault
from pqrl.faults import Fault, fault_of, fix_for

__all__ = ["check_env_servers"]

POLL_S = 0.5


async def check_env_servers(env: Any, env_ids: set[str], *, grace_s: float, children: Any = None) -> None:
    """Raises ``PermanentFault`` naming the server, the cause and the fix; returns when all is well.
    ``children`` (launcher.children): a child that dies meanwhile ends the wait with its own line."""
    t0 = time.monotonic()
    while isinstance(env, HttpEnvClient) and (down := await env.not_ready()):
        if children is not None and (line := children.death()) is not None:
            raise SystemExit(line)
        if time.monotonic() - t0 > grace_s:
            url, cause = next(iter(down.items()))
            raise PermanentFault(
                f"the env server {url} is not ready after {grace_s:g} s (rollout.backend_grace_s): {cause}",
                fix="start Docker, or fix the env server's DOCKER_HOST",
            )
        await asyncio.sleep(POLL_S)
    try:
        listed = await env.environments()
    except EnvServerError as e:
        if fault_of(e) is not Fault.JOB:
            raise
        raise PermanentFault(f"the env server refuses the job: {e}", fix=fix_for(e)) from None
    known = {str(e.get("id")) for e in listed}
    missing = sorted(env_ids - known)
    if missing:
        where = f"the env server {env.urls[0]}" if isinstance(env, HttpEnvClient) else "this process"
        raise PermanentFault(
            f"{where} has no environment {', '.join(missing)} (it has: {', '.join(sorted(known)) or 'none'})",
            fix=fix_for(UnknownEnv("")),
        )
