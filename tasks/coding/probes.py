"""Held-out expectations: the hidden tests' expected values never enter the grading container.

Whatever runs in the process that imports the patched code can rewrite that process's verdict
(pytest's outcome, its report, the exit status). So the grader does not ask that process whether
the tests passed. It rewrites every hidden test on the host before upload (``instrument``):

- ``assert A == <literal>`` becomes ``_probe(site, ops, lambda: A)``: the literal is dropped, and
  the value ``A`` computed by the code under test is recorded (encoded by
  tasks/coding/probe_runtime.py, objects by their state) into a pipe the runner reads. Every
  ``Compare`` is rewritten this way; operands that are not literals are all recorded, and when
  none is a literal the truth of the comparison is recorded too (``pytest.approx(<literal>)``
  counts as a literal).
- ``assert A == B`` where the test computes ``B`` itself (``Matrix([[6, 8]])``, ``expected``): the
  operand the fix does not change is *held* (tasks/coding/held.py finds it by running the same
  tests on the unfixed repository): the rewritten test sent to a submission no longer computes it
  (nor a plain assignment only it reads), and the host requires the kept operands to equal the
  gold's values in the same position.
- ``assert X`` and ``assert not X`` both become ``_probe(site, (), lambda: X)``: the polarity
  stays on the host, so the recorded truth value cannot be guessed from the rewritten source.
- ``with pytest.raises(E, match=...)`` becomes ``with _raises(site):``, which records the type
  (its whole MRO, each class as ``module.qualname``) and message of what the body raised; ``E``
  and ``match`` stay on the host. The recorded MRO must equal the one the gold solution recorded
  at that site of that test, list for list: a record naming every exception class there is
  matches no site.
- assert messages are dropped (they often spell the expected value out);
- an assert using ``await``, ``yield``, ``:=`` or ``super()`` means something else inside a lambda:
  it is left as it is (an in-process check, its expectation visible).

The same rewritten tests run on the gold solution, on the host's behalf, twice, each in a fresh
container (to find values that vary between runs). ``compare`` then checks, test by test, that the
submission's record equals the gold record entry by entry. A forger that takes over the test
process can write any record it likes, but to match it must know what the correct code computes
for every recorded call: the values that are not in the container.

What the record does not protect: values a test carries outside its asserts (module constants,
parametrize tables, fixtures, data files) are in the container and can be copied by a forger that
emulates the test; an exception type a site expects can still be guessed (one exact class per
site, from the names in the code); a ``!=``, ``<`` or ``in`` between two computed values is
judged by the truth the container reports.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tasks.coding.assert_methods import as_asserts
from tasks.coding.probe_runtime import COMPARISONS, OVERFLOW
from tasks.coding.record import MAX_TEXT, BadRecord, Opaque, Record, decode, opaque_inside, parse_record

__all__ = [
    "BadRecord",
    "Instrumented",
    "Opaque",
    "Site",
    "compare",
    "decode",
    "instrument",
    "overflowed",
    "parse_record",
    "same",
    "strong_tests",
    "unstable_entries",
]

SCHEME = "8"  # bump when the rewriting or the record changes: cached gold records are keyed by it
PROBE, RAISES, MODULE = "_pqrl_probe", "_pqrl_raises", "pqrl_probe_runtime"
_OPS = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
    ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
}  # fmt: skip
REL_TOL, ABS_TOL = 1e-6, 1e-12  # pytest.approx's defaults: a correct fix may round differently


@dataclass(frozen=True)
class Site:
    """One rewritten assert or ``pytest.raises`` block, as the host remembers it."""

    path: str
    line: int
    kind: str  # "compare" | "value" | "raises"
    test: str  # the enclosing test's node id as far as the source says (``path::Class::func``)
    strong: bool  # its expectation is held on the host only (a dropped literal or a polarity)
    negated: bool = False
    ops: tuple[str, ...] = ()  # a comparison's operators, in order
    literals: tuple[tuple[int, Any], ...] = ()  # (operand index, value) of the dropped literals
    pure: tuple[int, ...] = ()  # operands whose evaluation has no effect (may be held on the host)
    held: tuple[int, ...] = ()  # operands not evaluated in the container: the gold's value stands
    raises: tuple[str, ...] = ()
    match: str | None = None


@dataclass
class Instrumented:
    files: dict[str, str]
    sites: dict[int, Site] = field(default_factory=dict)


_NOT_LITERAL = object()


def _literal_value(node: ast.expr) -> Any:
    """The value of a literal operand, evaluated once here (``pytest.approx(<literal>)`` as
    ``Approx``), or ``_NOT_LITERAL``."""
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("pytest.approx", "approx"):
        args = [_literal_value(a) for a in node.args]
        literal = bool(args) and not node.keywords and _NOT_LITERAL not in args
        return Approx(args[0]) if literal else _NOT_LITERAL
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_LITERAL


def _thunk(node: ast.expr) -> ast.Lambda:
    empty = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
    return ast.Lambda(args=empty, body=node)


def _needs_its_frame(node: ast.expr) -> bool:
    """An expression that means something else inside a lambda: ``await``/``yield`` (not allowed
    there), ``:=`` (would bind in the lambda), ``super()`` (needs the method's frame)."""
    frame_bound = (ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)
    return any(
        isinstance(n, frame_bound) or (isinstance(n, ast.Call) and ast.unparse(n.func) == "super")
        for n in ast.walk(node)
    )


_EFFECTFUL = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.IfExp, ast.BoolOp)


def _pure(node: ast.expr) -> bool:
    """An operand the submission's container may skip: straight-line value work (names, literals,
    attributes, subscripts, operators, calls) with no control flow or code of its own. Whether
    skipping it changed anything, the gold's second run tells (tasks/coding/held.py)."""
    return not any(isinstance(n, _EFFECTFUL) for n in ast.walk(node))


def _drop_dead_assignments(func: ast.FunctionDef | ast.AsyncFunctionDef, names: set[str]) -> None:
    """``expected = Money(5)`` whose value only held operands read: with them gone, the statement
    would still compute the expected value in the container, for code that reads the test's frame.
    Such assignments (one plain name, an effect-free value, read nowhere else) become ``pass``."""
    read = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
    dead = (
        names
        - read
        - {n for g in ast.walk(func) if isinstance(g, (ast.Global, ast.Nonlocal)) for n in g.names}
    )

    def prune(body: list[ast.stmt]) -> None:
        for i, stmt in enumerate(body):
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id in dead
                and _pure(stmt.value)
            ):
                body[i] = ast.copy_location(ast.Pass(), stmt)
            elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for block in ("body", "orelse", "finalbody"):
                    prune(getattr(stmt, block, None) or [])
                for handler in getattr(stmt, "handlers", None) or []:
                    prune(handler.body)

    if dead:
        prune(func.body)


def _raised_names(node: ast.expr) -> tuple[str, ...]:
    """``E``, ``mod.E`` or ``(A, B)`` -> the class names the block must raise (one of)."""
    items = node.elts if isinstance(node, ast.Tuple) else [node]
    return tuple(ast.unparse(i).rsplit(".", 1)[-1] for i in items)


class _Rewriter(ast.NodeTransformer):
    def __init__(self, path: str, sites: dict[int, Site], held: Mapping[int, tuple[int, ...]]) -> None:
        self.path, self.sites, self.scope, self.held = path, sites, [], held
        self.held_names: list[set[str]] = [set()]  # per function: names read by held operands

    def _site(self, node: ast.stmt, kind: str, strong: bool, **extra: Any) -> int:
        site = len(self.sites)
        test = "::".join([self.path, *self.scope])
        self.sites[site] = Site(self.path, node.lineno, kind, test, strong, **extra)
        return site

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> ast.AST:
        self.scope.append(node.name)
        self.held_names.append(set())
        try:
            out = self.generic_visit(node)
            if self.held_names[-1] and not isinstance(node, ast.ClassDef):
                _drop_dead_assignments(node, self.held_names[-1])
            return out
        finally:
            self.scope.pop()
            self.held_names.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        if _needs_its_frame(node.test):
            return node  # stays an in-process assert: correct, but its expectation is visible
        expr, negated = node.test, False
        while isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            expr, negated = expr.operand, not negated
        if isinstance(expr, ast.Compare) and all(type(op) in _OPS for op in expr.ops):
            operands = [expr.left, *expr.comparators]
            all_ops = tuple(_OPS[type(op)] for op in expr.ops)
            values = [_literal_value(o) for o in operands]
            literals = tuple((i, v) for i, v in enumerate(values) if v is not _NOT_LITERAL)
            pure = () if literals else tuple(i for i, o in enumerate(operands) if _pure(o))
            held = self.held.get(len(self.sites), ())  # expected operands the gold's value stands for
            self.held_names[-1] |= {
                n.id for i in held for n in ast.walk(operands[i]) if isinstance(n, ast.Name)
            }
            kept = [
                o
                for i, (o, v) in enumerate(zip(operands, values, strict=True))
                if v is _NOT_LITERAL and i not in held
            ]
            ops = [] if literals or held else list(all_ops)  # with a literal dropped, the host compares
            site = self._site(
                node,
                "compare",
                strong=bool(literals or held),
                negated=negated,
                ops=all_ops,
                literals=literals,
                pure=pure,
                held=held,
            )
        else:
            kept, ops = [expr], ["bool"]
            site = self._site(node, "value", strong=True, negated=negated)
        call = ast.Call(
            func=ast.Name(PROBE, ast.Load()),
            args=[ast.Constant(site), ast.Tuple([ast.Constant(o) for o in ops], ast.Load())]
            + [_thunk(k) for k in kept],
            keywords=[],
        )
        return ast.copy_location(ast.Expr(call), node)

    def visit_With(self, node: ast.With) -> ast.stmt:
        self.generic_visit(node)
        item = node.items[0] if len(node.items) == 1 else None
        ctx = item.context_expr if item else None
        if not (
            isinstance(ctx, ast.Call) and ctx.args and ast.unparse(ctx.func) in ("pytest.raises", "raises")
        ):
            return node
        match = next((k.value for k in ctx.keywords if k.arg == "match"), None)
        pattern = match.value if isinstance(match, ast.Constant) and isinstance(match.value, str) else None
        site = self._site(node, "raises", strong=False, raises=_raised_names(ctx.args[0]), match=pattern)
        call = ast.Call(func=ast.Name(RAISES, ast.Load()), args=[ast.Constant(site)], keywords=[])
        item.context_expr = call
        return node


_IMPORT = ast.ImportFrom(MODULE, [ast.alias("probe", PROBE), ast.alias("raises", RAISES)], 0)


def _after_preamble(body: list[ast.stmt]) -> int:
    """Where the recorder's import goes: after the docstring and ``from __future__`` imports,
    which must stay first."""
    i = 0
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        i = 1
    while i < len(body) and isinstance(body[i], ast.ImportFrom) and body[i].module == "__future__":
        i += 1
    return i


def instrument(files: dict[str, str], held: Mapping[int, tuple[int, ...]] | None = None) -> Instrumented:
    """The hidden test files rewritten so that no expected value is left in asserts (see module
    docstring); ``held``: site -> operands left out of the rewritten source (tasks/coding/held.py
    chooses them). Raises SyntaxError for a test file that does not parse."""
    out = Instrumented(files={})
    for path in sorted(files):
        tree = as_asserts(ast.parse(files[path], filename=path))  # unittest's methods too
        tree = _Rewriter(path, out.sites, held or {}).visit(tree)
        tree.body.insert(_after_preamble(tree.body), _IMPORT)
        out.files[path] = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    return out


def strong_tests(sites: dict[int, Site]) -> set[str]:
    """Test functions (``path::func``) with at least one expectation held only on the host."""
    return {s.test for s in sites.values() if s.strong}


# ---------------------------------------------------------------- the record


def same(a: Any, b: Any) -> bool:
    """Encoded values equal, with floats compared as pytest.approx does."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or _close(a, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def _close(a: float, b: float) -> bool:
    try:
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    except OverflowError:  # an int too large for a float: only exact equality counts
        return False


def _raised_ok(site: Site, gold: list[Any], got: list[Any]) -> bool:
    """The block raised the very class the gold solution raised there (identity: the whole MRO,
    by module and qualified name, never membership of a name), one ``E`` names, and a message
    that ``match`` finds."""
    entry = got[0] if len(got) == 1 and isinstance(got[0], dict) else {}
    want = gold[0] if len(gold) == 1 and isinstance(gold[0], dict) else {}
    mro = entry.get("!raised")
    if not (isinstance(mro, list) and mro and mro == want.get("!raised")):
        return False
    if not any(isinstance(c, str) and c.rsplit(".", 1)[-1] in site.raises for c in mro):
        return False
    msg = entry.get("msg", "")
    if not isinstance(msg, str):
        return False
    return site.match is None or re.search(site.match, msg[:MAX_TEXT]) is not None


class Approx:
    """``pytest.approx(<literal>)`` on the host: numbers within its default tolerances."""

    def __init__(self, expected: Any) -> None:
        self.expected = expected

    def __eq__(self, other: object) -> bool:
        return _approx(self.expected, other)

    __hash__ = None  # type: ignore[assignment]


def _approx(want: Any, got: Any) -> bool:
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(want) == len(got) and all(_approx(w, g) for w, g in zip(want, got, strict=True))
    if isinstance(want, dict) and isinstance(got, dict):
        return want.keys() == got.keys() and all(_approx(want[k], got[k]) for k in want)
    if isinstance(want, (int, float)) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return want == got or _close(got, want)
    return bool(want == got)


def _holds_on_host(site: Site, got: list[Any]) -> bool | None:
    """The original assert, evaluated on the host with the recorded operands and the dropped
    literals; None when an operand is not a builtin value (then the gold record decides)."""
    recorded = [decode(v) for v in got]
    if any(opaque_inside(v) for v in recorded):
        return None
    by_index = dict(site.literals)
    operands = [by_index[i] if i in by_index else recorded.pop(0) for i in range(len(site.ops) + 1)]
    if site.ops[0] in ("is", "is not") and any(isinstance(o, (bool, type(None))) for o in operands):
        # identity with None/True/False survives the round trip as equality of those singletons
        ops = tuple("==" if op == "is" else "!=" for op in site.ops)
    else:
        ops = site.ops
    try:
        truth = all(COMPARISONS[op](a, b) for op, a, b in zip(ops, operands, operands[1:], strict=False))
    except Exception:  # e.g. ``<`` between recorded values of types that do not order
        return False
    return truth is not site.negated


def _raised_in(got: list[Any]) -> bool:
    return any(isinstance(v, dict) and "!raised" in v for v in got)


def _entry_ok(site: Site | None, want: list[Any] | None, got: list[Any], gold: list[Any]) -> bool:
    """One recorded check against the host's expectation (``want``: the gold entry, None when it
    varies between gold runs; ``gold``: the gold entry all the same, whose raised class is kept
    even where its message varies)."""
    if site is None:
        return False
    if site.kind == "raises":
        return _raised_ok(site, gold, got)
    if _raised_in(got):  # the original assert raised: the test fails, unless the gold's raised too
        return _raised_in(gold) and got[-1] == gold[-1] and (want is None or same(want, got))
    if site.kind == "value":
        return got == [{"!truth": not site.negated}]
    if site.held:  # the operands the fix changes must equal the gold's; the rest are the gold's own
        n = len(site.ops) + 1
        if want is None or len(want) < n:
            return False
        kept = [want[i] for i in range(n) if i not in site.held]
        return len(got) == len(kept) and same(kept, got)
    if site.literals:
        if len(got) != len(site.ops) + 1 - len(site.literals):
            return False
        held = _holds_on_host(site, got)
        return held if held is not None else (want is not None and same(want, got))
    truth = got[-1] if got else None
    if truth != {"!truth": not site.negated}:
        return False
    equal_chain = not site.negated and set(site.ops) == {"=="}
    return not equal_chain or want is None or same(want, got)


def compare(
    gold: Record,
    got: Record,
    sites: dict[int, Site],
    tests: list[str],
    unstable: set[tuple[str, int]] = frozenset(),  # type: ignore[assignment]
    skip: set[tuple[str, int]] = frozenset(),  # type: ignore[assignment]
) -> dict[str, str]:
    """Test id -> why its record differs from the gold one (absent: it matches). Entries are
    compared in order; ``unstable`` (test, index) entries varied between gold runs, so only their
    site is compared; ``skip`` entries only by site. The reason names the site's file and line,
    never the expected value."""
    problems: dict[str, str] = {}
    for test in tests:
        want, have = gold.get(test, []), got.get(test, [])
        if len(want) != len(have):
            problems[test] = f"{len(have)} checks recorded, the correct code records {len(want)}"
            continue
        for i, ((w_site, w_values), (h_site, h_values)) in enumerate(zip(want, have, strict=True)):
            site = sites.get(h_site)
            where = f"{site.path}:{site.line}" if site else f"unknown site {h_site}"
            if w_site != h_site:
                problems[test] = f"check {i} ran at {where}, the correct code's ran elsewhere"
                break
            if (test, i) in skip:
                continue
            want_values = None if (test, i) in unstable else w_values
            try:
                ok = _entry_ok(site, want_values, h_values, w_values)
            except BadRecord:  # forged or corrupted: the check fails, the grading goes on
                problems[test] = f"the check at {where} recorded a value the recorder cannot write"
                break
            if not ok:
                problems[test] = f"the check at {where} failed"
                break
    return problems


def overflowed(record: Record) -> set[str]:
    """Tests whose record the recorder stopped (the record reached its size limit): what they
    recorded is not whole, so their outcome alone judges them."""
    return {t for t, entries in record.items() if any(v == [OVERFLOW] for _, v in entries)}


def unstable_entries(first: Record, second: Record) -> tuple[set[tuple[str, int]], set[str]]:
    """Two gold runs -> the (test, index) entries whose values differ, and the tests whose
    sequence of sites differs (those are judged by pytest's outcome alone)."""
    entries: set[tuple[str, int]] = set()
    tests: set[str] = overflowed(first) | overflowed(second)
    for test in (first.keys() | second.keys()) - tests:
        a, b = first.get(test, []), second.get(test, [])
        if [s for s, _ in a] != [s for s, _ in b]:
            tests.add(test)
            continue
        entries |= {(test, i) for i, ((_, x), (_, y)) in enumerate(zip(a, b, strict=True)) if not same(x, y)}
    return entries, tests
