"""Parses Hermes/Qwen-style tool calls out of the text a model generated.

    <tool_call>{"name": "calculator", "arguments": {"expression": "2 + 2"}}</tool_call>

A malformed block becomes a ``MalformedCall`` whose message is shown to the model as the tool
result, so it can correct itself; it is never an exception in the agent loop.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["MalformedCall", "ParsedCall", "parse_tool_calls"]

_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class MalformedCall:
    raw: str
    error: str

    @property
    def message(self) -> str:
        return (
            f"Error: malformed tool call ({self.error}). Write "
            '<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> with valid JSON.'
        )


def parse_tool_calls(text: str, *, max_calls: int = 8) -> list[ParsedCall | MalformedCall]:
    """Every ``<tool_call>`` block of ``text``, in order (at most ``max_calls``)."""
    out: list[ParsedCall | MalformedCall] = []
    for match in _BLOCK.finditer(text):
        if len(out) == max_calls:
            out.append(MalformedCall("", f"more than {max_calls} calls in one turn; the rest were ignored"))
            break
        body, closing = match.group(1).strip(), match.group(2)
        if not closing:
            out.append(MalformedCall(body, "missing </tool_call>"))
            continue
        out.append(_parse_one(body))
    return out


def _parse_one(body: str) -> ParsedCall | MalformedCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return MalformedCall(body, f"invalid JSON: {e.msg} at column {e.colno}")
    if not isinstance(obj, dict):
        return MalformedCall(body, "the call must be a JSON object")
    name, arguments = obj.get("name"), obj.get("arguments", {})
    if not isinstance(name, str) or not name:
        return MalformedCall(body, 'missing "name"')
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return MalformedCall(body, '"arguments" is a string that is not JSON')
    if not isinstance(arguments, dict):
        return MalformedCall(body, '"arguments" must be an object')
    return ParsedCall(name, arguments)
