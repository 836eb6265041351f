"""The tool-call record: one call the model made, from the parsed text to the Trajectory.

A parser turns the model's text into ``ToolCall``s (``status`` None: not run yet; a block it could
not read is ``ToolCall.malformed``, already ``invalid``). The environment receives the calls that
are still to run, and the agent loop records each with the ``ToolStatus`` its tool message
reported. The env server's HTTP model of a call is built from this record's fields (all but
``OUTCOME_FIELDS``), so a field added here travels to the environment too.

Standard library only, so the floor stays importable anywhere.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["MALFORMED", "MAX_NAME_CHARS", "OUTCOME_FIELDS", "ToolCall", "ToolStatus"]

MALFORMED = "<malformed>"  # the name recorded for a block no parser could read
MAX_NAME_CHARS = 128  # of a tool's name and a call's id, as the env server accepts them
OUTCOME_FIELDS = frozenset({"status", "error"})  # what became of a call: never sent to an environment


class ToolStatus(enum.StrEnum):
    """How one tool call ended. The environment reports it with each tool message (the agent loop
    adds ``invalid`` for calls it could not parse); the record stores it, serialised as its value.
    """

    OK = "ok"  # the tool ran and returned
    ERROR = "error"  # the tool ran and failed
    INVALID = "invalid"  # never ran: malformed call, unknown tool or arguments that fail the schema
    TIMEOUT = "timeout"  # cut off at the tool time limit
    SKIPPED = "skipped"  # never ran: an earlier call in the same step ended the episode


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model made and what became of it.

    Attributes:
        name: the tool's name (``MALFORMED`` for a block that could not be parsed).
        arguments: the JSON arguments (``{"raw": text}`` for a malformed block).
        status: how the call ended; None until it has run. Coerced to a ``ToolStatus``, so the
            string values read back from stored records work too.
        id: the handle its tool message answers to (the agent loop numbers the calls of a turn).
        error: for a call that never reached the environment, the message the model is shown
            in place of a tool result.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    status: ToolStatus | None = None
    id: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if self.status is None:
            return
        try:
            object.__setattr__(self, "status", ToolStatus(self.status))
        except ValueError:
            raise ValueError(
                f"tool call status {self.status!r} is not one of {[s.value for s in ToolStatus]}"
            ) from None

    @classmethod
    def malformed(cls, raw: str, error: str) -> ToolCall:
        """A block that could not be parsed: ``invalid`` at once, answered with ``error``."""
        return cls(MALFORMED, {"raw": raw[:200]}, ToolStatus.INVALID, error=error)

    @property
    def pending(self) -> bool:
        """Still to run in the environment."""
        return self.status is None

    def ended(self, status: ToolStatus) -> ToolCall:
        """This call with the status its tool message reported."""
        return replace(self, status=status)
