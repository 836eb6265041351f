"""The built-in tool-call formats, named as SGLang and vLLM name their parsers.

Each ``ToolFormat`` reads the calls out of a model's text (``parse``) and writes calls back in the
same format (``render``: worked examples, scripted experts, round trips), with ``example``, the
format spelled out for the model (in its instructions and in every malformed-call error).

- ``hermes`` (Hermes, Qwen2.5): ``<tool_call>{"name": "f", "arguments": {...}}</tool_call>``
- ``qwen3_coder``: ``<tool_call><function=f><parameter=p>value</parameter></function></tool_call>``
- ``llama3_json``: ``{"name": "f", "parameters": {...}}``, after ``<|python_tag|>`` or alone, ``;``
  between calls
- ``mistral``: ``[TOOL_CALLS][{"name": "f", "arguments": {...}}]`` (or ``[TOOL_CALLS]f[ARGS]{...}``)
- ``pythonic``: ``[f(a=1), g(b="x")]``
- ``gemma``: a fenced ``tool_code`` block of ``f(a=1)`` lines

A block a parser recognises but cannot read is a ``ToolCall.malformed`` whose error tells the model
what was wrong and how to write the call; text that holds no call at all is no call.

Calls inside reasoning (``<think>...</think>``, Qwen3 and DeepSeek-R1 style) are not calls: as with
SGLang's and vLLM's reasoning parsers, only the text after the reasoning block is parsed. The block
opens the turn, or the template opened it at the end of the prompt (the parse is told); one never
closed holds the whole turn. A ``<think>`` anywhere else is text, a file's content say.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_loop.python_calls import find_gemma, find_pythonic, write_python
from pqrl.finite import loads_finite, nonfinite_path, raw_decode_finite
from pqrl.tool_calls import MAX_NAME_CHARS, ToolCall

__all__ = ["BUILTIN_FORMATS", "Calls", "ToolFormat", "outside_reasoning"]

Schemas = Sequence[Mapping[str, Any]] | None


class Calls:
    """The calls of one text as a parser finds them: at most ``max_calls``, then one note."""

    def __init__(self, example: str, max_calls: int) -> None:
        self.example, self.max_calls, self.out = example, max_calls, list[ToolCall]()

    @property
    def full(self) -> bool:
        return len(self.out) > self.max_calls

    def add(self, call: ToolCall) -> None:
        if self.full:
            return
        if len(self.out) == self.max_calls:
            call = self.bad("", f"more than {self.max_calls} calls in one turn; the rest were ignored")
        self.out.append(call)

    def bad(self, body: str, reason: str) -> ToolCall:
        return ToolCall.malformed(body, f"Error: malformed tool call ({reason}). Write {self.example}")

    def malformed(self, body: str, reason: str) -> None:
        self.add(self.bad(body, reason))

    def named(self, body: str, name: Any, arguments: Any) -> None:
        """A call from a decoded name and arguments, or the reason it is malformed."""
        if not isinstance(name, str) or not name.strip():
            return self.malformed(body, 'missing "name"')
        if len(name) > MAX_NAME_CHARS:
            return self.malformed(body, f'"name" is longer than {MAX_NAME_CHARS} characters')
        if isinstance(arguments, str):  # some models emit the arguments as a JSON string
            try:
                arguments = loads_finite(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                return self.malformed(body, '"arguments" is a string that is not JSON')
            except ValueError as e:
                return self.malformed(body, f"{e}; numbers must be finite")
        if not isinstance(arguments, dict):
            return self.malformed(body, '"arguments" must be an object')
        where = nonfinite_path(arguments)
        if where is not None:  # literals written in Python syntax (1e999) decode to inf
            return self.malformed(
                body, f"{where or 'arguments'} is not a finite number; numbers must be finite"
            )
        self.add(ToolCall(name.strip(), arguments))

    def json_object(self, body: str, obj: Any, keys: tuple[str, ...] = ("arguments",)) -> None:
        if not isinstance(obj, dict):
            return self.malformed(body, "the call must be a JSON object")
        arguments = next((obj[k] for k in keys if k in obj), {})
        self.named(body, obj.get("name"), arguments)

    def decode(self, body: str, keys: tuple[str, ...] = ("arguments",)) -> None:
        """One JSON object that is the whole of ``body``."""
        try:
            obj = loads_finite(body)
        except json.JSONDecodeError as e:
            return self.malformed(body, f"invalid JSON: {e.msg} at column {e.colno}")
        except ValueError as e:  # NaN, Infinity, 1e999: no bound or comparison can hold them
            return self.malformed(body, f"{e}; numbers must be finite")
        self.json_object(body, obj, keys)


@dataclass(frozen=True)
class ToolFormat:
    """One way of writing tool calls.

    Attributes:
        name: the parser's name (``model.tool_parser``).
        find: ``(text, calls, tools)``: adds every call of ``text`` to ``calls`` in order.
        write: the text of one call (``name``, ``arguments``).
        join: what goes between the written calls of one turn; ``wrap`` puts the result inside
            the format's outer markers.
        example: the format spelled out for the model.
        reasoning: the tags around reasoning, whose text is never parsed for calls; None: no reasoning.
        call_id: the id of the n-th call of a conversation (0-based), as the format's templates
            accept ids: the tool message of each result carries it (Mistral's templates refuse
            any id but 9 letters or digits).
    """

    name: str
    find: Callable[[str, Calls, Schemas], None]
    write: Callable[[str, Mapping[str, Any]], str]
    example: str
    join: str = "\n"
    wrap: str = "{}"
    call_id: Callable[[int], str] = lambda n: f"call_{n}"
    reasoning: tuple[str, str] | None = ("<think>", "</think>")

    def parse(
        self, text: str, *, max_calls: int = 8, tools: Schemas = None, thinking: bool = False
    ) -> list[ToolCall]:
        """Every call of ``text`` outside its reasoning, in order (``max_calls`` at most, then a
        note); ``thinking``: the prompt ended inside a reasoning block the template opened."""
        calls = Calls(self.example, max_calls)
        if self.reasoning is not None:
            text = outside_reasoning(text, *self.reasoning, opened=thinking)
        self.find(text, calls, tools)
        return calls.out

    def __call__(self, text: str, *, max_calls: int = 8, tools: Schemas = None) -> list[ToolCall]:
        return self.parse(text, max_calls=max_calls, tools=tools)

    def thinking_after(self, prompt: str) -> bool:
        """Whether a prompt ends inside a reasoning block (the template opened it for the model)."""
        return self.reasoning is not None and prompt.rstrip().endswith(self.reasoning[0])

    def render(self, calls: Sequence[ToolCall | Mapping[str, Any]]) -> str:
        """The text a model in this format writes for ``calls`` (records or ``{"name", "arguments"}``)."""
        parts = [self.write(*_name_args(c)) for c in calls]
        return self.wrap.format(self.join.join(parts)) if parts else ""

    def instructions(self) -> str:
        """How to call a tool, for a system message."""
        return (
            f"To call a tool, write exactly\n{self.example}\nEach result comes back in a message of its own."
        )


def outside_reasoning(
    text: str, start: str = "<think>", end: str = "</think>", *, opened: bool = False
) -> str:
    """``text`` without its reasoning block, as SGLang's reasoning parsers read it: a block that
    opens the turn (``opened``: the template opened it in the prompt) ends at the first ``end``, and
    one never closed holds the whole turn; a ``start`` anywhere else is text (a file's content)."""
    rest = text.lstrip()
    if not opened and not rest.startswith(start):
        return text
    rest = rest if opened else rest[len(start) :]
    _, closed, after = rest.partition(end)
    return after if closed else ""


def _name_args(call: ToolCall | Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    if isinstance(call, ToolCall):
        return call.name, call.arguments
    return str(call["name"]), call.get("arguments") or {}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- hermes ---------------------------------------------------------------------------------------

_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


def _find_hermes(text: str, calls: Calls, tools: Schemas) -> None:
    for match in _HERMES.finditer(text):
        body, closing = match.group(1).strip(), match.group(2)
        if body.startswith("<function="):  # a Qwen3-Coder call inside the same wrapper
            calls.malformed(body, "this is the qwen3_coder format; set model.tool_parser: qwen3_coder")
        elif not closing:
            calls.malformed(body, "missing </tool_call>")
        else:
            calls.decode(body)
        if calls.full:
            return


# -- qwen3_coder ----------------------------------------------------------------------------------

_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)(</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _find_qwen3_coder(text: str, calls: Calls, tools: Schemas) -> None:
    for block in _HERMES.finditer(text):  # Qwen3-Coder models fall back to Hermes JSON at times
        if "<function=" not in block.group(1) and block.group(1).strip().startswith("{"):
            calls.malformed(block.group(1).strip(), "this is the hermes format; write <function=...>")
    for match in _FUNCTION.finditer(text):
        name, body, closing = match.group(1).strip(), match.group(2), match.group(3)
        raw = match.group(0)
        if not closing:
            calls.malformed(raw, "missing </function>")
        else:
            _qwen3_call(raw, name, body, calls, _properties(tools, name))
        if calls.full:
            return


def _qwen3_call(raw: str, name: str, body: str, calls: Calls, props: Mapping[str, Any]) -> None:
    arguments: dict[str, Any] = {}
    for p in _PARAMETER.finditer(body):
        key, value, closing = p.group(1).strip(), p.group(2), p.group(3)
        if not closing:
            return calls.malformed(raw, f"missing </parameter> after <parameter={key}>")
        if not key:
            return calls.malformed(raw, "a <parameter=...> without a name")
        value = value.removeprefix("\n").removesuffix("\n")
        try:
            spec = props.get(key)  # a schema may be a bare true/false, not an object
            arguments[key] = _typed(value, spec.get("type") if isinstance(spec, dict) else None)
        except ValueError as e:
            return calls.malformed(raw, f"parameter {key!r}: {e}")
    if _PARAMETER.sub("", body).strip():
        return calls.malformed(raw, "text inside <function=...> outside any <parameter=...>")
    calls.named(raw, name, arguments)


def _typed(value: str, kind: Any) -> Any:
    """A parameter's text as its schema's type: strings as written, other types as JSON; a type
    that allows a string too, or no type at all, decodes JSON where it can and keeps the text
    otherwise (validation coerces it), an object or array without a type only when it decodes."""
    kinds = set(kind) if isinstance(kind, list) else {kind} - {None}
    if kinds and kinds <= {"string", "null"}:
        return value
    loose = not kinds or "string" in kinds
    if not kinds and not value.strip().startswith(("{", "[")):
        return value
    try:
        return loads_finite(value)
    except json.JSONDecodeError:
        if loose:
            return value
        raise ValueError(f"{value[:40]!r} is not JSON of type {kind}") from None
    except ValueError:  # a non-finite number: as text where text is allowed, else malformed
        if loose:
            return value
        raise


def _properties(tools: Schemas, name: str) -> Mapping[str, Any]:
    for t in tools or ():
        fn = t.get("function", t)
        if isinstance(fn, dict) and fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties")
            return props if isinstance(props, dict) else {}
    return {}


def _write_qwen3_coder(name: str, arguments: Mapping[str, Any]) -> str:
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else _dumps(v)}\n</parameter>\n"
        for k, v in arguments.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


# -- llama3_json ----------------------------------------------------------------------------------

_PYTHON_TAG = "<|python_tag|>"
_JSON_CALL = re.compile(r'\{\s*"name"\s*:')
_LINE_JSON_CALL = re.compile(r'^[ \t]*\{\s*"name"\s*:', re.MULTILINE)
_NEXT_CALL = re.compile(r'\s*;?\s*(?=\{\s*"name"\s*:)')


def _find_llama3_json(text: str, calls: Calls, tools: Schemas) -> None:
    """Calls after ``<|python_tag|>``, or calls that open a line: JSON inside prose ("the record is
    {"name": ...}") is an answer, not a call. Calls follow one another, ``;`` between them."""
    tagged = _PYTHON_TAG in text
    region = text.split(_PYTHON_TAG, 1)[1] if tagged else text
    first = (_JSON_CALL if tagged else _LINE_JSON_CALL).search(region)
    if first is None:
        if tagged:
            calls.malformed(region, f"no JSON call after {_PYTHON_TAG}")
        return
    pos = region.index("{", first.start())
    while not calls.full:
        try:
            obj, end = raw_decode_finite(region, pos)
        except json.JSONDecodeError as e:
            return calls.malformed(region[pos:], f"invalid JSON: {e.msg}")
        except ValueError as e:
            return calls.malformed(region[pos:], f"{e}; numbers must be finite")
        calls.json_object(region[pos:end], obj, ("parameters", "arguments"))
        following = _NEXT_CALL.match(region, end)
        if following is None:
            return
        pos = following.end()


def _write_llama3_json(name: str, arguments: Mapping[str, Any]) -> str:
    return _dumps({"name": name, "parameters": dict(arguments)})


# -- mistral --------------------------------------------------------------------------------------

_TOOL_CALLS = "[TOOL_CALLS]"


def _find_mistral(text: str, calls: Calls, tools: Schemas) -> None:
    for segment in text.split(_TOOL_CALLS)[1:]:
        body = segment.strip()
        if body.startswith(("[", "{")):
            _mistral_json(body, calls)
        elif "[ARGS]" in body:  # the newer form: NAME[ARGS]{...} (maybe NAME[CALL_ID]id[ARGS]{...})
            name, args = body.split("[ARGS]", 1)
            try:
                arguments, _ = raw_decode_finite(args.strip(), 0)
            except ValueError as e:
                calls.malformed(body, f"invalid JSON after [ARGS]: {e}")
            else:
                calls.named(body, name.split("[CALL_ID]")[0], arguments)
        else:
            calls.malformed(body, f"{_TOOL_CALLS} must be followed by a JSON list of calls")
        if calls.full:
            return


def _mistral_json(body: str, calls: Calls) -> None:
    try:
        value, _ = raw_decode_finite(body, 0)
    except json.JSONDecodeError as e:
        return calls.malformed(body, f"invalid JSON: {e.msg} at column {e.colno}")
    except ValueError as e:
        return calls.malformed(body, f"{e}; numbers must be finite")
    for obj in value if isinstance(value, list) else [value]:
        calls.json_object(body, obj)
        if calls.full:
            return


BUILTIN_FORMATS: dict[str, ToolFormat] = {
    f.name: f
    for f in (
        ToolFormat(
            "hermes",
            _find_hermes,
            lambda n, a: f"<tool_call>{_dumps({'name': n, 'arguments': dict(a)})}</tool_call>",
            '<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> with valid JSON.',
            join="",
        ),
        ToolFormat(
            "qwen3_coder",
            _find_qwen3_coder,
            _write_qwen3_coder,
            "<tool_call>\n<function=TOOL>\n<parameter=NAME>\nVALUE\n</parameter>\n</function>\n</tool_call>",
        ),
        ToolFormat(
            "llama3_json",
            _find_llama3_json,
            _write_llama3_json,
            '{"name": "TOOL", "parameters": {...}} as valid JSON (";" between calls).',
            join="; ",
        ),
        ToolFormat(
            "mistral",
            _find_mistral,
            lambda n, a: _dumps({"name": n, "arguments": dict(a)}),
            '[TOOL_CALLS][{"name": "TOOL", "arguments": {...}}] with valid JSON.',
            join=", ",
            wrap=_TOOL_CALLS + "[{}]",
            call_id=lambda n: f"call{n % 100000:05d}",  # 9 letters or digits, as its templates demand
        ),
        ToolFormat(
            "pythonic",
            find_pythonic,
            write_python,
            '[TOOL(name=value, ...), OTHER(name="text")] as a Python list of calls.',
            join=", ",
            wrap="[{}]",
        ),
        ToolFormat(
            "gemma",
            find_gemma,
            write_python,
            "```tool_code\nTOOL(name=value, ...)\n``` with one call per line.",
            wrap="```tool_code\n{}\n```",
        ),
    )
}
