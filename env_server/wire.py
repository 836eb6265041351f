"""The env server's request bodies and its error replies, shared by the FastAPI routes
(env_server.app) and the direct session routes (env_server.fast_path)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from env_server.sessions import EnvServerError, TooManySessions
from env_server.types import ToolCallRequest
from pqrl.finite import nonfinite_path

__all__ = ["CreateSession", "StepRequest", "env_error_reply"]


def _utf8_only(value: Any) -> Any:
    """Rejects strings that cannot be encoded (lone surrogates): they could never be replied to."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, dict):
        for k, v in value.items():
            _utf8_only(k)
            _utf8_only(v)
    elif isinstance(value, list):
        for v in value:
            _utf8_only(v)
    return value


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _encodable(cls, data: Any) -> Any:
        try:
            _utf8_only(data)
        except UnicodeEncodeError as e:
            raise ValueError(f"text must be valid UTF-8 (found {e.reason})") from None
        # the JSON parser reads NaN, Infinity and 1e999 as floats; in a dict[str, Any] field (a tool
        # call's arguments, a task) no float field's check would see them
        where = nonfinite_path(data)
        if where is not None:
            raise ValueError(f"{where or 'body'}: numbers must be finite (no NaN or Infinity)")
        return data


class CreateSession(_In):
    env_id: str = Field(min_length=1, max_length=128)
    task: dict[str, Any] = Field(default_factory=dict)
    seed: int | None = None
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="over the registered defaults")
    request_id: str | None = Field(default=None, max_length=128, description="retry-safe id of this create")


class StepRequest(_In):
    tool_calls: list[ToolCallRequest] = Field(max_length=64)
    request_id: str | None = Field(default=None, max_length=128, description="retry-safe id of this step")


def env_error_reply(exc: EnvServerError) -> tuple[int, dict[str, str], dict[str, str] | None]:
    """(status, ``{"error", "detail"}`` body, headers) of a session error: 429 carries Retry-After."""
    headers = {"Retry-After": f"{exc.retry_after:g}"} if isinstance(exc, TooManySessions) else None
    return exc.status, {"error": exc.code, "detail": str(exc)}, headers
