"""Records that cross the environment interface, in process and over HTTP alike."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pqrl.trajectory import ToolStatus

__all__ = [
    "ErrorBody",
    "Message",
    "Observation",
    "RewardResult",
    "SessionInfo",
    "StepResult",
    "ToolCallRequest",
    "ToolStatus",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Message(_Model):
    """One chat message. A tool result is ``role="tool"`` with the call's id, the tool's name and
    ``status``, how the call ended (``ok`` when not given); other roles carry no status."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = None
    tool_call_id: str | None = None
    status: ToolStatus | None = None

    @model_validator(mode="after")
    def _status_on_tool_results(self) -> Message:
        if self.role == "tool" and self.status is None:
            self.status = ToolStatus.OK
        elif self.role != "tool" and self.status is not None:
            raise ValueError(f"only tool messages carry a status, not a {self.role} message")
        return self


class ToolCallRequest(_Model):
    """A call the model made, as the environment receives it: the tool's name, its JSON arguments
    and the id its tool message will answer to. (``pqrl.trajectory.ToolCall`` is the record of the
    call kept in the Trajectory.)"""

    name: str = Field(min_length=1, max_length=128)
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = Field(default=None, max_length=128)


class Observation(_Model):
    """What the model sees first: the initial messages and the tools it may call."""

    messages: list[Message]
    tools: list[dict[str, Any]] = Field(description="OpenAI-style function schemas")


class StepResult(_Model):
    """One tool message per call, in order; ``done`` when the episode is over."""

    messages: list[Message]
    done: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class RewardResult(_Model):
    reward: float
    info: dict[str, Any] = Field(default_factory=dict)


class SessionInfo(_Model):
    """A created session: its id and first observation."""

    session_id: str
    env_id: str
    observation: Observation


class ErrorBody(_Model):
    """What every error of the env server answers, whatever its status."""

    error: str = Field(description="a stable code, e.g. not_found, invalid_request, request_id_conflict")
    detail: str = Field(description="what went wrong, for people")
