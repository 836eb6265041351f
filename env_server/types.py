"""Records that cross the environment interface, in process and over HTTP alike."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal, Self, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from pqrl.tool_calls import MAX_NAME_CHARS, OUTCOME_FIELDS, ToolCall, ToolStatus

__all__ = [
    "ErrorBody",
    "ExampleCall",
    "Message",
    "Observation",
    "RewardResult",
    "SessionInfo",
    "StepResult",
    "ToolCall",
    "ToolCallRequest",
    "ToolStatus",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a NaN reward trains nothing


class ExampleCall(_Model):
    """A tool call in an assistant message an environment writes (a worked example): the agent
    loop writes it in the model's own format, so no environment depends on one."""

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    arguments: dict[str, Any] = Field(default_factory=dict)


class Message(_Model):
    """One chat message. A tool result is ``role="tool"`` with the call's id, the tool's name and
    ``status``, how the call ended (``ok`` when not given); other roles carry no status. An
    assistant message may carry ``tool_calls``, written after its content in the model's format."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = None
    tool_call_id: str | None = None
    status: ToolStatus | None = None
    tool_calls: list[ExampleCall] | None = None

    @model_validator(mode="after")
    def _status_on_tool_results(self) -> Message:
        if self.role == "tool" and self.status is None:
            self.status = ToolStatus.OK
        elif self.role != "tool" and self.status is not None:
            raise ValueError(f"only tool messages carry a status, not a {self.role} message")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"only assistant messages carry tool_calls, not a {self.role} message")
        return self

    @classmethod
    def calling(cls, name: str, content: str = "", **arguments: Any) -> Message:
        """An assistant message that calls tool ``name`` with ``arguments`` (after ``content``)."""
        call = ExampleCall(name=name, arguments=arguments)
        return cls(role="assistant", content=content, tool_calls=[call])


class _WireCall(_Model):
    """The base of ``ToolCallRequest``: converts between it and the record."""

    @classmethod
    def of(cls, call: ToolCall) -> Self:
        return cls.model_validate({name: getattr(call, name) for name in cls.model_fields})

    def to_call(self) -> ToolCall:
        return ToolCall(**{name: getattr(self, name) for name in type(self).model_fields})


_LENGTHS = {"name": (1, MAX_NAME_CHARS), "id": (None, MAX_NAME_CHARS)}  # the HTTP API's limits


def _wire_call_model() -> type[_WireCall]:
    """``ToolCallRequest``: the fields of ``ToolCall`` that say what to run (its outcome stays out),
    with their types and defaults, and the HTTP API's length limits."""
    hints = get_type_hints(ToolCall)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(ToolCall):
        if f.name in OUTCOME_FIELDS:
            continue
        min_length, max_length = _LENGTHS.get(f.name, (None, None))
        if f.default_factory is not dataclasses.MISSING:
            info = Field(default_factory=f.default_factory, min_length=min_length, max_length=max_length)
        else:
            default = ... if f.default is dataclasses.MISSING else f.default
            info = Field(default, min_length=min_length, max_length=max_length)
        fields[f.name] = (hints[f.name], info)
    return create_model(
        "ToolCallRequest",
        __base__=_WireCall,
        __module__=__name__,
        __doc__="A call the model made, as the environment receives it over HTTP: the tool's name, its "
        "JSON arguments and the id its tool message will answer to (the fields of "
        "``pqrl.tool_calls.ToolCall`` but its outcome).",
        **fields,
    )


if TYPE_CHECKING:  # a model whose fields exist only at run time: to a type checker, its base
    ToolCallRequest = _WireCall
else:
    ToolCallRequest = _wire_call_model()


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
