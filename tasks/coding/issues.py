"""Issue texts for generated bugs, written from the first failing test as a user would report it.

The text shows the failing test's code up to the statement that failed (the reproduction) and
the error pytest reported for it, never the traceback through the module (that would point at
the bug) and never the name of the hidden test file.
"""

from __future__ import annotations

import ast
import re
import textwrap

from tasks.coding.junit import TestOutcome

__all__ = ["issue_text"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_MAX_ERROR_LINES = 8


def _test_node(tree: ast.Module, test_id: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The test function a pytest node id names: ``file::test``, ``file::Class::test`` (nested
    classes, a method inherited from a class of the same file), a parametrized ``test[...]`` by its
    function; else the one function of that name in the file, or None."""
    *classes, name = [p.split("[", 1)[0] for p in test_id.split("::")[1:]]
    defined = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    scopes: list[list[ast.stmt]] = [tree.body]
    for cls in classes:
        node = next((n for n in scopes[-1] if isinstance(n, ast.ClassDef) and n.name == cls), None)
        scopes, todo = [], [node] if node is not None else []
        while todo:  # the class, then its bases defined in this file (a mixin's tests)
            node = todo.pop(0)
            if node.body in scopes:  # `class A(A)` after an earlier A: seen already
                continue
            scopes.append(node.body)
            todo += [defined[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in defined][:8]
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for body in scopes:
        for n in body:
            if isinstance(n, funcs) and n.name == name:
                return n
    named = [n for n in ast.walk(tree) if isinstance(n, funcs) and n.name == name]
    return named[0] if len(named) == 1 else None


def _snippet(test_source: str, test_id: str, failing_line: int | None) -> str:
    """Imports, helpers used, and the test body up to the statement holding ``failing_line``."""
    tree = ast.parse(test_source)
    func = _test_node(tree, test_id)
    lines = re.split(r"\r\n|\r|\n", test_source)  # ast's line numbers, not str.splitlines'
    body = (
        [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if func
        else []
    )
    if not body:  # generated or empty: the test's name is all there is to show
        return "# " + ".".join(p.split("[", 1)[0] for p in test_id.split("::")[1:])
    end = body[-1].end_lineno or body[-1].lineno
    if failing_line is not None:
        for stmt in body:
            if stmt.lineno <= failing_line <= (stmt.end_lineno or stmt.lineno):
                end = stmt.end_lineno or stmt.lineno
    code = textwrap.dedent("\n".join(lines[body[0].lineno - 1 : end]))
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("test_")]
    helpers = [
        ast.get_source_segment(test_source, n) or "" for n in funcs if re.search(rf"\b{n.name}\(", code)
    ]
    used = code + "".join(helpers)
    header = [
        ast.get_source_segment(test_source, n) or ""
        for n in tree.body
        if isinstance(n, ast.ImportFrom)
        or (isinstance(n, ast.Import) and any(f"{a.asname or a.name}." in used for a in n.names))
    ]
    prelude = "".join(h + "\n\n\n" for h in helpers)
    return "\n".join(header) + "\n\n\n" + prelude + code


def _failing_line(text: str, test_file: str) -> int | None:
    name = test_file.rsplit("/", 1)[-1]
    for m in re.finditer(r"^(\S+?):(\d+): ", text, re.MULTILINE):
        if m.group(1).endswith(name):
            return int(m.group(2))
    return None


def _error_lines(outcome: TestOutcome) -> list[str]:
    """The last block of pytest's ``E`` lines: the exception and assertion explanation."""
    blocks: list[list[str]] = []
    previous_was_e = False
    for line in outcome.text.splitlines():
        is_e = line.startswith("E ") or line == "E"
        if is_e and not previous_was_e:
            blocks.append([])
        if is_e:
            blocks[-1].append(line[1:])
        previous_was_e = is_e
    lines = textwrap.dedent("\n".join(blocks[-1])).splitlines() if blocks else [outcome.message]
    lines = [_ADDRESS.sub("", line.rstrip())[:200] for line in lines if line.strip()]
    if len(lines) > _MAX_ERROR_LINES:
        lines = lines[:_MAX_ERROR_LINES] + ["..."]
    return lines


def issue_text(module: str, source_path: str, test_file: str, test_source: str, outcome: TestOutcome) -> str:
    """A bug report for ``outcome`` (a failing test of ``test_file``) against ``source_path``."""
    test_name = outcome.id.rsplit("::", 1)[-1].split("[", 1)[0]
    snippet = _snippet(test_source, outcome.id, _failing_line(outcome.text, test_file))
    errors = _error_lines(outcome)
    first = errors[0] if errors else outcome.outcome
    if first.startswith("Failed: DID NOT RAISE"):
        symptom = "an expected exception is not raised"
    elif first.startswith(("assert ", "AssertionError")):
        symptom = "it returns a wrong result"
    else:
        symptom = f"it raises {first.split(':', 1)[0]}"
    topic = test_name.removeprefix("test_").replace("_", " ")
    error_block = "\n".join(errors)
    return (
        f"{module}: {topic} is broken ({symptom})\n\n"
        f"Something is wrong in `{source_path}`. This check fails:\n\n"
        f"```python\n{snippet}\n```\n\n"
        f"The failure:\n\n```\n{error_block}\n```\n\n"
        "Expected: the check passes, and everything that works today keeps working."
    )
