"""The tool-call formats written in Python syntax: ``pythonic`` (``[f(a=1), g(b="x")]``) and
``gemma`` (a fenced ``tool_code`` block of ``f(a=1)`` lines). Argument values are read as literals
only (``ast.literal_eval``), never run, and must have a JSON form."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = ["find_gemma", "find_pythonic", "write_python"]

Schemas = Sequence[Mapping[str, Any]] | None


class Calls(Protocol):
    """What a finder adds calls to (``tool_formats.Calls``)."""

    @property
    def full(self) -> bool: ...

    def malformed(self, body: str, reason: str) -> None: ...

    def named(self, body: str, name: Any, arguments: Any) -> None: ...


_PY_LIST = re.compile(r"^[ \t]*(\[\s*[A-Za-z_][\w.]*\s*\()", re.MULTILINE)


def find_pythonic(text: str, calls: Calls, tools: Schemas) -> None:
    """Lists of calls that stand on their own lines: ``use [len(x)]`` or ``x = [f(v) for v in s]``
    in prose or code is not a call."""
    pos = 0
    while (match := _PY_LIST.search(text, pos)) is not None and not calls.full:
        start = match.start(1)
        end = _closing_bracket(text, start)
        tree = _python(text[start:end], "eval") if end > 0 else None
        if not isinstance(tree, ast.Expression):
            calls.malformed(text[start:], "not a Python list of calls: f(a=1)")
            return
        rest = text[end:].split("\n", 1)[0]
        if isinstance(tree.body, ast.List) and not rest.strip():
            for node in tree.body.elts:
                _python_call(ast.unparse(node), node, calls)
        pos = end


def _closing_bracket(text: str, start: int) -> int:
    """Just past the bracket that closes ``text[start]``, strings skipped; -1 if none (one pass, so a
    long text of brackets costs one parse, not one per bracket)."""
    depth, quote, i = 0, "", start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _python(source: str, mode: str) -> ast.AST | str:
    """The parsed source, or why it is not Python (deep nesting and NUL bytes included)."""
    try:
        return ast.parse(source.strip(), mode=mode)
    except SyntaxError as e:
        return f"not Python: {e.msg} on line {e.lineno}"
    except (ValueError, RecursionError, MemoryError) as e:
        return f"not Python: {type(e).__name__}"


def _python_call(raw: str, node: ast.expr, calls: Calls) -> None:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name | ast.Attribute):
        return calls.malformed(raw, "each call must be name(argument=value, ...)")
    if node.args:
        return calls.malformed(raw, "arguments must be given by name: f(a=1), not f(1)")
    arguments: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            return calls.malformed(raw, "no **arguments: name every argument")
        try:
            arguments[kw.arg] = _json_value(ast.literal_eval(kw.value))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return calls.malformed(raw, f"argument {kw.arg!r} is not a literal value")
    calls.named(raw, ast.unparse(node.func), arguments)


def _json_value(value: Any) -> Any:
    """A Python literal as the JSON value it means (tuples as lists); sets, bytes, complex numbers
    and non-string keys have no JSON form (TypeError), so no tool could be given them."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_value(v) for k, v in value.items()}
    raise TypeError(type(value).__name__)


def write_python(name: str, arguments: Mapping[str, Any]) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


_TOOL_CODE = re.compile(r"```tool_code\s*\n(.*?)(```|$)", re.DOTALL)


def find_gemma(text: str, calls: Calls, tools: Schemas) -> None:
    for match in _TOOL_CODE.finditer(text):
        body, closing = match.group(1).strip(), match.group(2)
        if not closing:
            calls.malformed(body, "missing the closing ```")
            return
        tree = _python(body, "exec")
        if not isinstance(tree, ast.Module):
            calls.malformed(body, str(tree))
            continue
        for st in tree.body:
            node = st.value if isinstance(st, ast.Expr) else None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                node = node.args[0] if len(node.args) == 1 and not node.keywords else node  # print(f(...))
            if node is None:
                calls.malformed(ast.unparse(st), "each line must be one call: f(a=1)")
            else:
                _python_call(ast.unparse(node), node, calls)
            if calls.full:
                return
