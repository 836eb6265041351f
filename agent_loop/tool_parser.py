"""Tool-call parsers by name: the built-in formats (``agent_loop.tool_formats``) and plug-ins.

``model.tool_parser`` names one, as SGLang and vLLM name theirs: ``hermes`` (Hermes, Qwen2.5),
``qwen3_coder``, ``llama3_json``, ``mistral``, ``pythonic``, ``gemma``. A parser is a
``ToolFormat``: ``parse(text)`` gives the calls in the order written, each still to run (``status``
None), except a block it could not read: that is ``ToolCall.malformed``, status ``invalid``, whose
``error`` is shown to the model as the tool result, so it can correct itself; it is never an
exception in the agent loop. Numbers must be finite: a ``NaN``, ``Infinity`` or ``1e999`` anywhere
in a call makes it malformed (no bound or comparison downstream could hold one). ``render(calls)``
writes calls back in the same format.

Installed packages add parsers through the entry-point group ``pqrl.tool_parsers``: each entry
point names a ``ToolFormat`` (or a callable returning one) registered under the entry point's name.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from agent_loop.tool_formats import BUILTIN_FORMATS, Calls, ToolFormat
from pqrl.errors import UsageError
from pqrl.tool_calls import ToolCall

__all__ = [
    "DEFAULT_PARSER",
    "ENTRY_POINT_GROUP",
    "PARSERS",
    "Calls",
    "ToolFormat",
    "UnknownToolParser",
    "as_openai_calls",
    "get_parser",
    "parse_tool_calls",
    "register_parser",
    "tool_call_text",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "pqrl.tool_parsers"
DEFAULT_PARSER = "hermes"
PARSERS: dict[str, ToolFormat] = dict(BUILTIN_FORMATS)
_plugins_loaded = False


class UnknownToolParser(UsageError):
    def __init__(self, name: str) -> None:
        super().__init__(
            f"unknown tool parser {name!r}",
            fix=f"set model.tool_parser to one of {', '.join(sorted(PARSERS))}, or install its plug-in",
        )


def register_parser(fmt: ToolFormat) -> None:
    """Adds a parser under ``fmt.name`` (a later registration of the same name replaces it)."""
    if not isinstance(fmt, ToolFormat):
        raise TypeError(f"a tool parser must be a ToolFormat, not {type(fmt).__name__}")
    PARSERS[fmt.name] = fmt


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj: Any = ep.load()
            fmt = obj if isinstance(obj, ToolFormat) else obj()
            if fmt.name != ep.name:  # the name a config gives is the entry point's
                fmt = dataclasses.replace(fmt, name=ep.name)
            register_parser(fmt)
        except Exception as e:  # one broken plug-in must not take the built-in parsers down
            log.warning("tool parser plug-in %s (%s) failed to load: %s", ep.name, ep.value, e)


def get_parser(name: str = DEFAULT_PARSER) -> ToolFormat:
    """The parser called ``name`` (plug-ins loaded on first use); ``UnknownToolParser`` if none."""
    if name not in PARSERS:
        _load_plugins()
    try:
        return PARSERS[name]
    except KeyError:
        raise UnknownToolParser(name) from None


def parse_tool_calls(
    text: str, *, max_calls: int = 8, parser: str = DEFAULT_PARSER, tools: Any = None
) -> list[ToolCall]:
    """Every call of ``text`` in the format of ``parser``, in order (at most ``max_calls``)."""
    return get_parser(parser).parse(text, max_calls=max_calls, tools=tools)


def tool_call_text(name: str, /, **arguments: Any) -> str:
    """One call as a model in the default format writes it (scripted experts, tests)."""
    return get_parser(DEFAULT_PARSER).render([ToolCall(name, arguments)])


def as_openai_calls(
    calls: list[ToolCall | Mapping[str, Any]], parser: ToolFormat | None = None, first: int = 0
) -> list[dict[str, Any]]:
    """``calls`` as the ``tool_calls`` field chat templates render (OpenAI's shape); a call without
    an id gets ``parser``'s id of call number ``first + i`` of the conversation."""
    fmt = parser or get_parser(DEFAULT_PARSER)
    out = []
    for i, c in enumerate(calls):
        name, arguments, given = (
            (c.name, c.arguments, c.id)
            if isinstance(c, ToolCall)
            else (c["name"], c.get("arguments"), c.get("id"))
        )
        out.append({"id": given or fmt.call_id(first + i), "type": "function",
                    "function": {"name": name, "arguments": dict(arguments or {})}})  # fmt: skip
    return out
