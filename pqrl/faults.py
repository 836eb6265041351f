"""Which failures of a dependency are worth retrying: one table every rollout path classifies by.

- ``JOB``: permanent for the whole job (a wrong token, an unknown environment or model): retrying
  or running other tasks cannot help, so the job stops at once and leaves the task queued;
- ``TASK``: permanent for this task only (its reset rejects it, its grader fails its own gold): the
  task is dead-lettered with the cause and the job goes on;
- ``OUTAGE``: a backend is down (Docker unreachable): retried, and permanent for the job once it
  has lasted past its grace;
- ``TRANSIENT``: anything else (5xx, 429, a dropped connection): retried with backoff, bounded.
"""

from __future__ import annotations

import enum

__all__ = ["BadTask", "Fault", "classify", "fault_of", "fix_for", "fix_for_code"]


class Fault(enum.Enum):
    JOB = "job"
    TASK = "task"
    OUTAGE = "outage"
    TRANSIENT = "transient"


class BadTask(Exception):
    """Raised by task code when the task itself is wrong (a grader whose gold solution fails): the
    env server answers it as ``bad_task``, so the task is dead-lettered, not retried."""


# error codes (the env server's ``error`` field, the engine client's) -> class and what to fix
_CODES: dict[str, tuple[Fault, str]] = {
    "unauthorized": (Fault.JOB, "give the job the env server's token"),
    "unknown_environment": (Fault.JOB, "register the environment on the env server, or fix the env_id"),
    "engine_not_found": (Fault.JOB, "point the job at an engine that serves the model (it answered 404)"),
    "bad_task": (Fault.TASK, "fix or remove this task in its suite"),
    "sandbox_backend_down": (Fault.OUTAGE, "start Docker, or fix the env server's DOCKER_HOST"),
}


def classify(status: int | None, code: str = "") -> Fault:
    """The class of an answer with HTTP ``status`` (None: no answer) and error ``code``."""
    if code in _CODES:
        return _CODES[code][0]
    if status in (401, 403):
        return Fault.JOB
    if status is None or status >= 500 or status in (404, 408, 429):
        # 404 without a code: a session lost with a restarted server, not a missing route
        return Fault.TRANSIENT
    if 400 <= status < 500:
        return Fault.TASK  # this request is wrong; other tasks' requests may not be
    return Fault.TRANSIENT


def fault_of(e: BaseException) -> Fault:
    """The class of exception ``e``: from its ``status`` and ``code`` where it carries them (the env
    server's and the engine client's errors do); an error without an HTTP status is transient."""
    if isinstance(e, BadTask):
        return Fault.TASK
    status = getattr(e, "status", None)
    return classify(status if isinstance(status, int) else None, str(getattr(e, "code", "") or ""))


def fix_for_code(code: str) -> str:
    """What to do about an error with ``code`` (empty when the table has nothing to say)."""
    entry = _CODES.get(code)
    return entry[1] if entry else ""


def fix_for(e: BaseException) -> str:
    """What to do about ``e`` (empty when the table has nothing to say)."""
    code = str(getattr(e, "code", "") or "")
    if code in _CODES:
        return fix_for_code(code)
    if getattr(e, "status", None) in (401, 403):
        return "give the job the right token or API key"
    return ""
