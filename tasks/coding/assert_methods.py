"""unittest's assert methods as plain asserts, so that tasks/coding/probes.py rewrites them too.

Real suites check with ``self.assertEqual(a, b)`` as often as with ``assert a == b``; left as they
are, their expected values stay in the container and the test process's word decides. Before the
probes rewrite a file, each ``self.assert*`` statement whose meaning is one comparison becomes that
comparison as an ``assert`` (its ``msg`` dropped, as assert messages are), and ``assertRaises`` /
``assertRaisesRegex`` become ``pytest.raises`` blocks (both search the message with ``re.search``).
Methods whose meaning differs from a comparison (``assertAlmostEqual``, ``assertCountEqual``,
``assertSequenceEqual``, ``assertRaises(...) as cm``, a project's own helpers) stay as they are.
"""

from __future__ import annotations

import ast

__all__ = ["as_asserts"]

_COMPARE: dict[str, type[ast.cmpop]] = {
    "assertEqual": ast.Eq, "assertEquals": ast.Eq, "assertListEqual": ast.Eq, "assertTupleEqual": ast.Eq,
    "assertDictEqual": ast.Eq, "assertSetEqual": ast.Eq, "assertMultiLineEqual": ast.Eq,
    "assertNotEqual": ast.NotEq, "assertIs": ast.Is, "assertIsNot": ast.IsNot, "assertIn": ast.In,
    "assertNotIn": ast.NotIn, "assertGreater": ast.Gt, "assertGreaterEqual": ast.GtE, "assertLess": ast.Lt,
    "assertLessEqual": ast.LtE,
}  # fmt: skip
_NONE = {"assertIsNone": ast.Is, "assertIsNotNone": ast.IsNot}
_TRUTH = {"assertTrue": False, "assertFalse": True}  # -> negated
_RAISES = {"assertRaises": 1, "assertRaisesRegex": 2}  # -> how many arguments the block form takes


def _method(call: ast.expr) -> str | None:
    """``self.assertX(...)`` -> ``assertX`` (positional arguments only, or a ``msg``)."""
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "self"
        and not any(isinstance(a, ast.Starred) for a in call.args)
    ):
        return None
    return call.func.attr


def _assert(call: ast.Call) -> ast.expr | None:
    """The asserted expression of a one-comparison method call, or None."""
    name = _method(call)
    if name is None or any(k.arg != "msg" for k in call.keywords):
        return None
    args = call.args
    if name in _COMPARE and len(args) in (2, 3):
        return ast.Compare(args[0], [_COMPARE[name]()], [args[1]])
    if name in _NONE and len(args) in (1, 2):
        return ast.Compare(args[0], [_NONE[name]()], [ast.Constant(None)])
    if name in _TRUTH and len(args) in (1, 2):
        return ast.UnaryOp(ast.Not(), args[0]) if _TRUTH[name] else args[0]
    return None


def _raises(call: ast.expr, block: bool) -> ast.Call | None:
    """``assertRaises(E)`` / ``assertRaisesRegex(E, r)`` (the block form) or with a callable and its
    arguments (``block`` False) -> ``pytest.raises(E[, match=r])``."""
    name = _method(call)
    if name not in _RAISES or not isinstance(call, ast.Call):
        return None
    n = _RAISES[name]
    keywords = [k.arg for k in call.keywords]
    if len(call.args) < n or (block and (len(call.args) != n or keywords)):
        return None
    if not block and (len(call.args) == n or "msg" in keywords):
        return None
    match = [ast.keyword("match", call.args[1])] if n == 2 else []
    raises = ast.Attribute(ast.Name("pytest", ast.Load()), "raises", ast.Load())
    return ast.Call(raises, [call.args[0]], match)


class _AsAsserts(ast.NodeTransformer):
    def visit_Expr(self, node: ast.Expr) -> ast.stmt:
        test = _assert(node.value) if isinstance(node.value, ast.Call) else None
        if test is not None:
            return ast.copy_location(ast.Assert(test, None), node)
        raises = _raises(node.value, block=False)
        if raises is not None:  # assertRaises(E, f, *args, **kwargs): the call inside the block
            call = node.value
            assert isinstance(call, ast.Call)
            n = _RAISES[_method(call) or ""]
            inner = ast.Expr(ast.Call(call.args[n], call.args[n + 1 :], call.keywords))
            return ast.copy_location(ast.With([ast.withitem(raises, None)], [inner]), node)
        return node

    def visit_With(self, node: ast.With) -> ast.stmt:
        self.generic_visit(node)
        if len(node.items) == 1 and node.items[0].optional_vars is None:
            raises = _raises(node.items[0].context_expr, block=True)
            if raises is not None:
                node.items[0].context_expr = raises
        return node


def as_asserts(tree: ast.Module) -> ast.Module:
    """``tree`` with its ``self.assert*`` statements as asserts (see the module docstring)."""
    return ast.fix_missing_locations(_AsAsserts().visit(tree))
