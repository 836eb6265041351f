"""User-facing failures and the exit status that names their class.

The command line prints a ``PqrlError`` as one line (``pqrl <command>: <message>``, then what to
do) and no traceback unless ``--debug``. The class sets the exit status, so a script or a scheduler
can tell a fault to fix from one to wait out:

- 1 ``JobEnded``: the job stopped before its end (its plan used up, nothing left to train on);
- 2 ``UsageError``: bad input (a config, a suite file, a flag): fix it and run again;
- 3 ``PermanentFault``: a dependency refuses and retrying cannot help (401/403, an unknown model or
  environment, Docker unreachable past its grace, a grader that fails its own gold);
- 4 ``RetriesExhausted``: a dependency kept failing transiently past its retry bound.
"""

from __future__ import annotations

__all__ = ["JobEnded", "PermanentFault", "PqrlError", "RetriesExhausted", "UsageError"]


class PqrlError(Exception):
    """A failure the user can act on: ``str(e)`` says what happened, ``fix`` what to do about it."""

    exit_code = 1

    def __init__(self, message: str, *, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix

    def line(self) -> str:
        """The one line the command line prints."""
        return f"{self} ({self.fix})" if self.fix else str(self)


class JobEnded(PqrlError):
    exit_code = 1


class UsageError(PqrlError):
    exit_code = 2


class PermanentFault(PqrlError):
    exit_code = 3


class RetriesExhausted(PqrlError):
    exit_code = 4
