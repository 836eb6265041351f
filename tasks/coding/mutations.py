"""Bug injection by AST mutation, in the style of SWE-smith.

Each mutation is found on the AST but applied as a text edit at the node's source span, so the
rest of the file (comments, layout) is untouched and the gold patch (the inverse edit) is a small,
readable diff. Operators: swapped binary/comparison/boolean/augmented operators, off-by-one
integer constants, dropped ``+ 1``/``- 1`` terms, negated conditions, swapped call arguments,
``min``/``max`` swaps, flipped booleans, swapped ternary branches and removed statements.

AST column offsets are UTF-8 byte offsets and its lines end only at ``\n``, ``\r\n`` or ``\r``
(not at the form feeds or Unicode separators ``str.splitlines`` also breaks at): both are turned
into character offsets here, so any source Python reads can be mutated.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Mutation", "candidates", "mutations", "parses"]

_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")  # Python's own line ends only

_BINOP_SWAP: dict[type[ast.operator], tuple[str, str]] = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "/"),
    ast.Div: ("/", "*"),
    ast.FloorDiv: ("//", "/"),
    ast.Mod: ("%", "//"),
    ast.Pow: ("**", "*"),
}
_CMP_SWAP: dict[type[ast.cmpop], tuple[str, str]] = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
}
_AUG_SWAP = {
    ast.Add: ("+=", "-="),
    ast.Sub: ("-=", "+="),
    ast.Mult: ("*=", "//="),
    ast.FloorDiv: ("//=", "*="),
}
_REMOVABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Raise, ast.If, ast.Continue)


@dataclass(frozen=True)
class Mutation:
    """One text edit that injects a bug: ``source[start:end]`` becomes ``replacement``."""

    kind: str
    start: int
    end: int
    replacement: str
    line: int
    function: str  # qualified name of the enclosing function ("" at module level)
    description: str

    def apply(self, source: str) -> str:
        return source[: self.start] + self.replacement + source[self.end :]


class _Finder(ast.NodeVisitor):
    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = [line for line in _LINES.findall(source) if line]
        starts = [0]
        for line in self.lines:
            starts.append(starts[-1] + len(line))
        self.line_starts = starts
        self.scope: list[str] = []
        self.found: list[Mutation] = []
        self.skip: set[int] = set()  # ids of nodes never mutated (docstrings, annotations)

    # ---------------------------------------------------------------- helpers

    def offset(self, line: int, col: int) -> int:
        text = self.lines[line - 1] if line <= len(self.lines) else ""
        if not text.isascii():  # col counts UTF-8 bytes
            col = len(text.encode()[:col].decode("utf-8", "replace"))
        return self.line_starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (
            self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
            self.offset(node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
        )

    def text(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.source[start:end]

    def add(self, kind: str, start: int, end: int, replacement: str, line: int, description: str) -> None:
        self.found.append(Mutation(kind, start, end, replacement, line, ".".join(self.scope), description))

    def token_between(self, left: ast.AST, right: ast.AST, token: str) -> tuple[int, int] | None:
        """The span of ``token`` between two nodes, if the gap holds only it, spaces and parens."""
        start, end = self.span(left)[1], self.span(right)[0]
        gap = self.source[start:end]
        if "#" in gap or "\\" in gap:
            return None
        if " ".join(gap.replace("(", " ").replace(")", " ").split()) != token:
            return None
        first = token.split()[0]
        at = gap.find(first)
        if token.count(" "):  # "not in" / "is not": the span runs to the end of the last word
            last = token.split()[-1]
            stop = gap.find(last, at + len(first)) + len(last)
        else:
            stop = at + len(token)
        return start + at, start + stop

    # ---------------------------------------------------------------- scopes and skipped nodes

    def _docstring(self, body: list[ast.stmt]) -> None:
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            self.skip.add(id(body[0]))

    def visit_Module(self, node: ast.Module) -> None:
        self._docstring(node.body)
        self.visit_body(node.body)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._docstring(node.body)
        for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
            if arg.annotation is not None:
                self.skip.update(id(n) for n in ast.walk(arg.annotation))
        if node.returns is not None:
            self.skip.update(id(n) for n in ast.walk(node.returns))
        self.skip.update(id(n) for d in node.args.defaults for n in ast.walk(d))
        self.scope.append(node.name)
        self.visit_body(node.body)
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._docstring(node.body)
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.skip.update(id(n) for n in ast.walk(node.annotation))
        self.generic_visit(node)

    def visit_body(self, body: list[ast.stmt]) -> None:
        """Removed statements: whole lines, only in blocks that keep another statement."""
        if len(body) < 2:
            return
        for stmt in body:
            if id(stmt) in self.skip or not isinstance(stmt, _REMOVABLE) or not self.scope:
                continue
            start = self.line_starts[stmt.lineno - 1]
            end = self.line_starts[stmt.end_lineno]  # type: ignore[index]
            if self.source[start:end].strip() != self.text(stmt).strip():
                continue  # shares its lines with something else
            first = self.text(stmt).splitlines()[0].strip()
            self.add("remove_statement", start, end, "", stmt.lineno, f"removed `{first}`")

    def generic_visit(self, node: ast.AST) -> None:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            visited = isinstance(node, ast.Module | ast.FunctionDef) and field == "body"  # by their visitors
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt) and not visited:
                self.visit_body(block)
        super().generic_visit(node)

    # ---------------------------------------------------------------- operators

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if id(node) not in self.skip:
            swap = _BINOP_SWAP.get(type(node.op))
            if swap is not None:
                where = self.token_between(node.left, node.right, swap[0])
                if where is not None:
                    self.add("swap_operator", *where, swap[1], node.lineno, f"`{swap[0]}` -> `{swap[1]}`")
            right = node.right
            if (
                isinstance(node.op, ast.Add | ast.Sub)
                and isinstance(right, ast.Constant)
                and right.value == 1
                and type(right.value) is int
            ):
                start, end = self.span(node)
                dropped = f"dropped `{swap[0] if swap else '?'} 1`"
                self.add("drop_term", start, end, self.text(node.left), node.lineno, dropped)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if id(node) not in self.skip:
            left: ast.AST = node.left
            for op, right in zip(node.ops, node.comparators, strict=True):
                swap = _CMP_SWAP.get(type(op))
                where = self.token_between(left, right, swap[0]) if swap else None
                if swap is not None and where is not None:
                    self.add("swap_comparison", *where, swap[1], node.lineno, f"`{swap[0]}` -> `{swap[1]}`")
                left = right
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        if id(node) not in self.skip and len(node.values) == 2:
            token, other = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            where = self.token_between(node.values[0], node.values[1], token)
            if where is not None:
                self.add("swap_boolean", *where, other, node.lineno, f"`{token}` -> `{other}`")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        swap = _AUG_SWAP.get(type(node.op))
        where = self.token_between(node.target, node.value, swap[0]) if swap else None
        if swap is not None and where is not None:
            self.add("swap_operator", *where, swap[1], node.lineno, f"`{swap[0]}` -> `{swap[1]}`")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        droppable = isinstance(node.op, ast.USub | ast.Not) and not isinstance(node.operand, ast.Constant)
        if id(node) not in self.skip and droppable:
            start, end = self.span(node)
            token = "-" if isinstance(node.op, ast.USub) else "not"
            self.add("drop_unary", start, end, self.text(node.operand), node.lineno, f"dropped `{token}`")
        self.generic_visit(node)

    # ---------------------------------------------------------------- constants, conditions, calls

    def visit_Constant(self, node: ast.Constant) -> None:
        if id(node) in self.skip:
            return
        start, end = self.span(node)
        if type(node.value) is bool:
            flipped = str(not node.value)
            self.add("flip_boolean", start, end, flipped, node.lineno, f"`{node.value}` -> `{flipped}`")
        elif type(node.value) is int and abs(node.value) <= 10_000 and self.text(node).isdigit():
            for new in (node.value + 1, node.value - 1):
                if new >= 0:
                    self.add("off_by_one", start, end, str(new), node.lineno, f"`{node.value}` -> `{new}`")

    def _negate(self, test: ast.expr) -> None:
        if id(test) in self.skip or isinstance(test, ast.Compare | ast.UnaryOp):
            return  # comparisons are swapped instead; `not x` is dropped by visit_UnaryOp
        start, end = self.span(test)
        text = self.text(test)
        wrapped = f"not ({text})" if isinstance(test, ast.BoolOp | ast.BinOp | ast.IfExp) else f"not {text}"
        self.add("negate_condition", start, end, wrapped, test.lineno, "negated the condition")

    def visit_If(self, node: ast.If) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._negate(node.test)
        if id(node) not in self.skip:
            start, end = self.span(node)
            body, test, orelse = self.text(node.body), self.text(node.test), self.text(node.orelse)
            if self.source[start:end] == f"{body} if {test} else {orelse}":
                swapped = f"{orelse} if {test} else {body}"
                self.add("swap_branches", start, end, swapped, node.lineno, "swapped the branches")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if id(node) not in self.skip:
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("min", "max"):
                other = "max" if func.id == "min" else "min"
                start, end = self.span(func)
                self.add("swap_min_max", start, end, other, node.lineno, f"`{func.id}` -> `{other}`")
            args = node.args
            if len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2]):
                a, b = self.text(args[0]), self.text(args[1])
                (s0, e0), (s1, e1) = self.span(args[0]), self.span(args[1])
                if a != b and "\n" not in self.source[s0:e1]:
                    swapped = b + self.source[e0:s1] + a
                    self.add(
                        "swap_arguments", s0, e1, swapped, node.lineno, "swapped the first two arguments"
                    )
        self.generic_visit(node)


def candidates(source: str) -> list[Mutation]:
    """Every mutation found in ``source``, in source order, not yet checked: a large module has
    thousands, and parsing each mutant is the cost (``mutations`` checks them all; a sampler may
    check only the ones it draws, with ``parses``)."""
    finder = _Finder(source)
    finder.visit(ast.parse(source))
    return sorted(finder.found, key=lambda m: (m.start, m.end, m.kind, m.replacement))


def parses(mutated: str) -> bool:
    try:
        ast.parse(mutated)
    except SyntaxError:
        return False
    return True


def mutations(source: str) -> Iterator[Mutation]:
    """Every candidate mutation of ``source`` that still parses, in source order, without duplicates."""
    seen = {source}
    for m in candidates(source):
        mutated = m.apply(source)
        if mutated not in seen and parses(mutated):
            seen.add(mutated)
            yield m
