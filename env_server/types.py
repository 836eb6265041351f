"""Records that cross the environment interface, in process and over HTTP alike."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Message", "Observation", "RewardResult", "SessionInfo", "StepResult", "ToolCall"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Message(_Model):
    """One chat message; tool results are ``role="tool"`` with the call's id and tool name."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = None
    tool_call_id: str | None = None


class ToolCall(_Model):
    """A call the model made: the tool's name and its JSON arguments."""

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
