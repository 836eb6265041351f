"""``pqrl tasks validate --check``: every task of a suite, run as its environment's worked example
(the calls of a correct episode: it must earn the full reward, 1) and as an empty episode (submit
at once: it must earn 0), through the env server's SessionManager, so a sandboxed environment runs
in real sandboxes. A task that fails either is a task whose reward does not tell right from wrong."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from env_server.conformance import scripted_episodes
from env_server.registry import spec
from env_server.sessions import BackendDown, GraderFailure, InfraFailure, SessionManager, TooManySessions
from tasks.suite import Suite

__all__ = ["BACKOFF_S", "TRIES", "CheckFailure", "check_suite"]


TRIES = 3  # a check lost to the machine (a sandbox, a reference) is tried this often
BACKOFF_S = 30.0  # apart (a lost repo-v1 reference is computed again after its own backoff)


@dataclass(frozen=True)
class CheckFailure:
    task_id: str
    reason: str
    transient: bool = False  # the machine's fault every time it was tried: the task was not judged


async def check_suite(
    suite: Suite,
    *,
    jobs: int = 4,
    progress: Callable[[str], None] = print,
    manager: SessionManager | None = None,
    seed: int = 0,
) -> list[CheckFailure]:
    """The failing tasks of ``suite`` (in suite order), ``jobs`` tasks at once."""
    env_id = suite.manifest.env_id
    cls = spec(env_id).load()
    own = manager is None
    manager = manager or SessionManager(pool_size=0)
    gate = asyncio.Semaphore(max(1, jobs))
    done = 0

    async def one(task: Any) -> CheckFailure | None:
        nonlocal done
        for attempt in range(1, TRIES + 1):
            async with gate:
                reasons, lost = await _check_task(
                    manager, env_id, cls, task.model_dump(), suite.manifest.defaults, seed
                )
            if not lost or attempt == TRIES:
                break
            progress(
                f"[check] {task.id}: lost to the machine ({reasons[0][:200]}); again in {BACKOFF_S:.0f}s"
            )
            await asyncio.sleep(BACKOFF_S)
        done += 1
        mark = "ok" if not reasons else "NOT CHECKED" if lost else "FAIL"
        progress(f"[check {done}/{len(suite.tasks)}] {task.id}: {mark}")
        return CheckFailure(task.id, "; ".join(reasons), transient=lost) if reasons else None

    try:
        found = await asyncio.gather(*(one(t) for t in suite.tasks))
    finally:
        if own:
            await manager.shutdown()
    return [f for f in found if f is not None]


async def _check_task(
    manager: SessionManager, env_id: str, cls: Any, task: dict[str, Any], defaults: dict[str, Any], seed: int
) -> tuple[list[str], bool]:
    """The task's problems, and whether they are the machine's (then the task was not judged)."""
    try:
        calls = cls.worked_example(task)
    except Exception as e:  # a gold solution that cannot be laid out is this task's failure
        return [f"the worked example could not be built: {type(e).__name__}: {e}"], False
    if calls is None:
        return [f"{env_id} gives no worked example for this task"], False
    try:
        worked, empty = await scripted_episodes(manager, env_id, task, calls, seed, defaults or None)
    except (InfraFailure, BackendDown, TooManySessions) as e:
        lost = not isinstance(e, GraderFailure)  # a grader's bug is the task's environment's failure
        return [f"the episode failed: {type(e).__name__}: {str(e)[:300]}"], lost
    except Exception as e:  # the environment failed on this task: its reason, not a crash of the check
        return [f"the episode failed: {type(e).__name__}: {str(e)[:300]}"], _lost(e)
    return [f"worked example: {p}" for p in worked] + [f"empty episode: {p}" for p in empty], False


def _lost(e: BaseException | None) -> bool:
    """Whether ``e`` or what caused it says the machine, not the task, failed (``lost_to_machine``:
    e.g. a repo-v1 task retired after its reference was lost three times)."""
    while e is not None:
        if getattr(e, "lost_to_machine", False):
            return True
        e = e.__cause__
    return False
