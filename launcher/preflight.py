"""Before a job leases its first task: its env servers answer and take the job's token, every
environment of its suites is known (there, or in this process), and, when one of them needs
sandboxes, the servers are ready (``/readyz``: their sandbox backend answers), each within the grace.
A permanent fault found here stops the job with one line before anything of its task plan is spent."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from env_server.client import EnvUnavailable, HttpEnvClient
from env_server.sessions import EnvServerError
from pqrl.errors import PermanentFault
from pqrl.faults import Fault, fault_of, fix_for, fix_for_code

__all__ = ["check_env_servers"]

POLL_S = 0.5


async def check_env_servers(env: Any, env_ids: set[str], *, grace_s: float, children: Any = None) -> None:
    """Raises ``PermanentFault`` naming the server, the cause and the fix; returns when all is well.
    ``children`` (launcher.children): a child that dies meanwhile ends the wait with its own line."""
    deadline = time.monotonic() + grace_s
    where = f"the env server {env.urls[0]}" if isinstance(env, HttpEnvClient) else "this process"
    while True:
        try:
            listed = await env.environments()
            break
        except EnvUnavailable as e:
            fault = PermanentFault(f"{where} is unreachable after {grace_s:g} s: {e}",
                                   fix="start the env server, or fix its URL")  # fmt: skip
            await _wait(deadline, children, fault)
        except EnvServerError as e:
            if fault_of(e) is not Fault.JOB:
                raise
            raise PermanentFault(f"the env server refuses the job: {e}", fix=fix_for(e)) from None
    known = {str(e.get("id")): e for e in listed}
    missing = sorted(env_ids - set(known))
    if missing:
        raise PermanentFault(
            f"{where} has no environment {', '.join(missing)} (it has: {', '.join(sorted(known)) or 'none'})",
            fix=fix_for_code("unknown_environment"),
        )
    if not isinstance(env, HttpEnvClient) or not any(known[e].get("needs_sandbox") for e in env_ids):
        return
    while down := await env.not_ready():
        url, cause = next(iter(down.items()))
        why = f"the env server {url} is not ready after {grace_s:g} s (rollout.backend_grace_s): {cause}"
        fault = PermanentFault(why, fix=fix_for_code("sandbox_backend_down"))
        await _wait(deadline, children, fault)


async def _wait(deadline: float, children: Any, fault: PermanentFault) -> None:
    """A poll's pause; past ``deadline`` ``fault``; a dead child ends the job with its own line."""
    if children is not None and (died := children.death()) is not None:
        raise died
    if time.monotonic() > deadline:
        raise fault
    await asyncio.sleep(POLL_S)
