"""Parses the tool calls out of the text a model generated.

A parser is a function ``text -> list[ToolCall]`` (``ToolCallParser``), the calls in the order
written; ``PARSERS`` holds them by name. Each call is still to run (``status`` None), except a
block the parser could not read: that is ``ToolCall.malformed``, status ``invalid``, whose
``error`` is shown to the model as the tool result, so it can correct itself; it is never an
exception in the agent loop. Numbers must be finite: a ``NaN``, ``Infinity`` or ``1e999``
anywhere in a call makes it malformed (no bound or comparison downstream could hold one).

Hermes/Qwen (``hermes``)::

    <tool_call>{"name": "calculator", "arguments": {"expression": "2 + 2"}}</tool_call>
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from pqrl.finite import loads_finite
from pqrl.tool_calls import MAX_NAME_CHARS, ToolCall

__all__ = ["PARSERS", "ToolCallParser", "parse_tool_calls"]

ToolCallParser = Callable[[str], list[ToolCall]]

_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_HERMES_FORMAT = '<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> with valid JSON.'


def parse_tool_calls(text: str, *, max_calls: int = 8) -> list[ToolCall]:
    """Every ``<tool_call>`` block of ``text``, in order (at most ``max_calls``)."""
    out: list[ToolCall] = []
    for match in _BLOCK.finditer(text):
        if len(out) == max_calls:
            out.append(_malformed("", f"more than {max_calls} calls in one turn; the rest were ignored"))
            break
        body, closing = match.group(1).strip(), match.group(2)
        if not closing:
            out.append(_malformed(body, "missing </tool_call>"))
            continue
        out.append(_parse_one(body))
    return out


PARSERS: dict[str, ToolCallParser] = {"hermes": parse_tool_calls}


def _malformed(body: str, reason: str) -> ToolCall:
    return ToolCall.malformed(body, f"Error: malformed tool call ({reason}). Write {_HERMES_FORMAT}")


def _parse_one(body: str) -> ToolCall:
    try:
        obj = loads_finite(body)
    except json.JSONDecodeError as e:
        return _malformed(body, f"invalid JSON: {e.msg} at column {e.colno}")
    except ValueError as e:  # NaN, Infinity, 1e999: no bound or comparison can hold them
        return _malformed(body, f"{e}; numbers must be finite")
    if not isinstance(obj, dict):
        return _malformed(body, "the call must be a JSON object")
    name, arguments = obj.get("name"), obj.get("arguments", {})
    if not isinstance(name, str) or not name:
        return _malformed(body, 'missing "name"')
    if len(name) > MAX_NAME_CHARS:
        return _malformed(body, f'"name" is longer than {MAX_NAME_CHARS} characters')
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = loads_finite(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return _malformed(body, '"arguments" is a string that is not JSON')
        except ValueError as e:
            return _malformed(body, f"{e}; numbers must be finite")
    if not isinstance(arguments, dict):
        return _malformed(body, '"arguments" must be an object')
    return ToolCall(name, arguments)
