"""The source policy's rule against building a class at run time.

A class statement is checked statically (its dunder methods are in the source), but a class built
at run time takes its namespace from data: ``type('X', (), {'_'*2 + 'eq' + '_'*2: f})`` gives it any
dunder. Every such construction goes through a class factory called with a name, bases and a
namespace: ``type`` itself (a three-argument call reaches ``type.__new__``), any metaclass (which
only ``type(x)`` can hand out: ``x.__class__``, ``ABCMeta`` and ``EnumType`` are unreachable), or
the enum functional API (``Enum('X', names)``, on ``Enum``/``IntEnum``/``Flag``/``IntFlag`` or an
enum class without members; one with members refuses to be extended). ``__build_class__``,
``types.new_class`` and ``metaclass=`` are refused by the other rules.

So a factory may only be used where it cannot build a class: called with the one argument that
looks a type up (``type(x)``) or makes an instance (``Color(3)``; ``type(self)(v)`` is ``type(v)``
when ``self`` is a class, so its result is held to these rules too unless ``v`` is a literal, as
in ``type(self)([...])``), compared by identity or with a builtin class or a constant (``v ==
type`` hands it to ``v.__eq__``), given to ``isinstance``, ``issubclass``, ``str`` or ``repr``,
formatted, read an attribute from, written as a signature's annotation or in one never
evaluated, or stored in a plain local name whose every use obeys the same rules. Passed to
anything else (``map(type, ...)``, ``partial(type, ...)``), returned, subclassed (``class
M(type)``), subscripted (``type[int](...)`` calls ``type``) or stored elsewhere, it is flagged.
"""

from __future__ import annotations

import ast

__all__ = ["dynamic_class_uses"]

_ENUM_FACTORIES = frozenset({"Enum", "IntEnum", "Flag", "IntFlag"})
_BUILTIN_CLASSES = frozenset(
    [
        "bool",
        "bytearray",
        "bytes",
        "complex",
        "dict",
        "float",
        "frozenset",
        "int",
        "list",
        "object",
        "range",
        "set",
        "slice",
        "str",
        "tuple",
        "type",
    ]
)
# given a factory, these builtins run none of the file's code (str and repr: the metaclass's)
_PURE_CALLS = frozenset({"isinstance", "issubclass", "str", "repr", "id", "hash", "callable"})
# an expression whose value is surely no class: a literal
_NOT_CLASSES = (
    ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp,
    ast.GeneratorExp, ast.JoinedStr,
)  # fmt: skip
_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
TYPE, METACLASS, ENUM = "type", "type(...)", "enum"


def _enum_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Local names of the enum factories imported from ``enum``, and of ``enum`` imported whole."""
    names, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "enum" and node.level == 0:
            names |= {a.asname or a.name for a in node.names if a.name in _ENUM_FACTORIES}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "enum"}
    return names, modules


def _bound_names(tree: ast.Module, *, classes: bool = True) -> set[str]:
    """Every name the file binds (its class statements' names too, unless ``classes`` is off)."""
    names: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            names.add(n.id)
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) or classes and isinstance(n, ast.ClassDef):
            names.add(n.name)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.alias):
            names.add(n.asname or n.name)
        elif isinstance(n, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and n.name:
            names.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            names.add(n.rest)
        elif isinstance(n, ast.Global | ast.Nonlocal):
            names.update(n.names)
    return names


def _has_members(cls: ast.ClassDef) -> bool:
    """Whether an enum class surely has members, so the functional API refuses to extend it. An
    ``_ignore_`` list or a ``del`` in the body can take a member away: then it may have none."""
    names = {t.id for n in cls.body if isinstance(n, ast.Assign | ast.AnnAssign) for t in _targets(n)}
    if "_ignore_" in names or any(isinstance(n, ast.Delete) for n in ast.walk(cls)):
        return False
    return any(map(_is_member, cls.body))


def _targets(stmt: ast.Assign | ast.AnnAssign) -> list[ast.Name]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return [t for t in targets if isinstance(t, ast.Name)]


def _is_member(stmt: ast.stmt) -> bool:
    """A statement of an enum body that surely makes a member (a constant or ``auto()``); a
    descriptor (a function, a lambda) makes none, so anything unsure counts as no member."""
    if isinstance(stmt, ast.Assign):
        targets, value = stmt.targets, stmt.value
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        targets, value = [stmt.target], stmt.value
    else:
        return False
    if not all(isinstance(t, ast.Name) and not t.id.startswith("_") for t in targets):
        return False
    if isinstance(value, ast.UnaryOp):
        value = value.operand
    if isinstance(value, ast.Tuple):
        return all(isinstance(v, ast.Constant) for v in value.elts)
    if isinstance(value, ast.Call) and not value.args and not value.keywords:
        func = value.func
        return (isinstance(func, ast.Name) and func.id == "auto") or (
            isinstance(func, ast.Attribute) and func.attr == "auto"
        )
    return isinstance(value, ast.Constant)


class _Analysis:
    def __init__(self, tree: ast.Module) -> None:
        self.parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        self.found: list[tuple[ast.AST, str]] = []
        self.future = any(
            isinstance(n, ast.ImportFrom)
            and n.module == "__future__"
            and any(a.name == "annotations" for a in n.names)
            for n in tree.body
        )
        self.stored: set[int] = set()  # a signature's annotations: evaluated, the value kept apart
        self.unevaluated = self._unevaluated_annotations(tree)
        self.globals = {
            name for n in ast.walk(tree) if isinstance(n, ast.Global | ast.Nonlocal) for name in n.names
        }
        self.loads: list[ast.Name] = [
            n for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        ]
        # indexes, so following a stored factory costs its uses, not the file (a file may store many)
        self.loads_by_name: dict[str, list[ast.Name]] = {}
        self.loads_in: dict[tuple[str, int], list[ast.Name]] = {}  # (name, id of innermost scope)
        for n in self.loads:
            self.loads_by_name.setdefault(n.id, []).append(n)
            self.loads_in.setdefault((n.id, id(self.scope(n))), []).append(n)
        self.inner_scopes: dict[int, list[ast.AST]] = {}
        for scope in ast.walk(tree):
            if isinstance(scope, _SCOPES) and scope is not tree:
                self.inner_scopes.setdefault(id(self.scope(scope)), []).append(scope)
        self.tainted: set[tuple[str, int, str]] = set()  # (name, id of its scope or 0: the file, kind)
        # isinstance and issubclass only test against a class, unless the file rebinds them
        bound = _bound_names(tree)
        self.checks = _PURE_CALLS - bound
        # builtin classes the file does not rebind, and its own classes bound by nothing else: a
        # class compares through its metaclass (type, ABCMeta, EnumType), by identity
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        self.classes = (_BUILTIN_CLASSES - bound) | (defined - _bound_names(tree, classes=False))
        self.enum_names: set[str] = set()  # the enum factories and enum classes, as the file names them

    def _unevaluated_annotations(self, tree: ast.Module) -> set[int]:
        """Nodes of annotations never evaluated: a local variable's, and every one under ``from
        __future__ import annotations``. A signature's annotations are evaluated (``f(x: g(type))``
        runs ``g``), so only their value is kept apart (``stored``): only ``__annotations__``, a
        dunder, holds it."""
        roots: list[ast.AST] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                every = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                every += [a for a in (node.args.vararg, node.args.kwarg) if a is not None]
                signature = [a.annotation for a in every if a.annotation is not None]
                signature += [node.returns] if node.returns is not None else []
                if self.future:
                    roots += signature
                else:
                    self.stored |= {id(a) for a in signature}
            elif isinstance(node, ast.AnnAssign) and (
                self.future or isinstance(self.scope(node), ast.FunctionDef | ast.AsyncFunctionDef)
            ):
                roots.append(node.annotation)
        return {id(n) for root in roots for n in ast.walk(root)}

    def inert(self, node: ast.expr) -> bool:
        """A value whose comparisons run no code of the file: a constant, a class (builtin or the
        file's), ``type(x)`` (a class: its metaclass compares identities), or a literal tuple of them."""
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return all(map(self.inert, node.elts))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type":
            return len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Starred)
        return isinstance(node, ast.Constant) or (isinstance(node, ast.Name) and node.id in self.classes)

    def scope(self, node: ast.AST) -> ast.AST:
        node = self.parents[node]
        while not isinstance(node, _SCOPES):
            node = self.parents[node]
        return node

    def flag(self, node: ast.AST, kind: str, how: str) -> None:
        self.found.append((node, f"{kind} {how}: a class factory that could build a class at run time"))

    def taint(self, target: ast.Name, kind: str, pending: list[tuple[ast.expr, str]]) -> None:
        scope = self.scope(target)
        whole_file = target.id in self.globals or isinstance(scope, ast.Module)
        key = (target.id, 0 if whole_file else id(scope), kind)
        if key in self.tainted:
            return
        self.tainted.add(key)
        if whole_file:
            pending += [(n, kind) for n in self.loads_by_name.get(target.id, [])]
            return
        scopes = [scope]  # its scope and every scope nested in it (a closure reads it too)
        while scopes:
            inner = scopes.pop()
            pending += [(n, kind) for n in self.loads_in.get((target.id, id(inner)), [])]
            scopes += self.inner_scopes.get(id(inner), [])

    def _called_with(self, node: ast.expr, parent: ast.AST) -> ast.Call | None:
        """The call ``node`` is an argument of, directly or in a tuple (``isinstance(x, (a, b))``)."""
        if isinstance(parent, ast.Call) and node in parent.args:
            return parent
        outer = self.parents.get(parent)
        if isinstance(parent, ast.Tuple) and isinstance(outer, ast.Call) and parent in outer.args:
            return outer
        return None

    def check(self, node: ast.expr, kind: str, pending: list[tuple[ast.expr, str]]) -> None:
        if id(node) in self.unevaluated or id(node) in self.stored:
            return
        parent = self.parents[node]
        if isinstance(parent, ast.Call) and parent.func is node:
            starred = any(isinstance(a, ast.Starred) for a in parent.args) or any(
                k.arg is None for k in parent.keywords
            )
            count = len(parent.args) + len(parent.keywords)
            one = not starred and len(parent.args) == 1 and not parent.keywords
            if kind == TYPE and one:
                pending.append((parent, METACLASS))  # type(x) may be a metaclass
            elif kind == METACLASS and one and not isinstance(parent.args[0], _NOT_CLASSES):
                # type(x)(c) is type(c) when type(x) is type: another metaclass, unless c is surely
                # no class (a literal); type(self)([...]) stays an instance
                pending.append((parent, METACLASS))
            # an instance needs fewer than the name, bases and namespace (or the enum's names)
            elif (
                not starred
                and count < {METACLASS: 3, ENUM: 2, TYPE: 0}[kind]
                and not (kind == ENUM and parent.keywords)
            ):
                return
            else:
                self.flag(parent, kind, f"called with {count} argument(s){' unpacked' if starred else ''}")
        elif isinstance(parent, ast.Attribute | ast.MatchClass | ast.FormattedValue):
            return  # f"{type}" formats through the metaclass, which runs no code of the file
        elif isinstance(parent, ast.Compare):
            # == and in call the other side's __eq__/__contains__ with it (a user class's, which
            # could call it); `is` compares identities, a builtin class or a constant runs nothing
            others = [o for o in (parent.left, *parent.comparators) if o is not node]
            if not all(isinstance(op, ast.Is | ast.IsNot) for op in parent.ops) and not all(
                map(self.inert, others)
            ):
                self.flag(node, kind, "compared with something whose comparison could receive it")
        elif (call := self._called_with(node, parent)) is not None:
            if not (isinstance(call.func, ast.Name) and call.func.id in self.checks):
                self.flag(node, kind, "passed as an argument")
        elif kind == ENUM and isinstance(parent, ast.Subscript) and parent.value is node:
            return  # Color["RED"]; as the index, obj[B] hands it to obj.__getitem__
        elif kind == ENUM and isinstance(parent, ast.ClassDef) and node in parent.bases:
            # a base named as such makes the class an enum this analysis knows; under an alias not
            if not (isinstance(node, ast.Attribute) or getattr(node, "id", None) in self.enum_names):
                self.flag(node, kind, "subclassed under another name")
        elif isinstance(parent, ast.Assign | ast.NamedExpr | ast.AnnAssign) and parent.value is node:
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            if isinstance(self.scope(parent), ast.ClassDef):  # a class attribute: read back as C.m, self.m
                self.flag(node, kind, "stored as a class attribute")
            elif all(isinstance(t, ast.Name) for t in targets):
                for t in targets:
                    self.taint(t, kind, pending)  # type: ignore[arg-type]
            else:
                self.flag(node, kind, "stored in something other than a plain name")
        else:
            self.flag(node, kind, f"used in a {type(parent).__name__}")

    def run(self, tree: ast.Module) -> list[tuple[ast.AST, str]]:
        names, modules = _enum_names(tree)
        classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        enum_classes: set[str] = set()
        while True:  # enum classes of this file, whatever their depth of subclassing
            found = {
                c.name
                for c in classes
                if any(
                    (isinstance(b, ast.Name) and b.id in names | enum_classes)
                    or (
                        isinstance(b, ast.Attribute)
                        and isinstance(b.value, ast.Name)
                        and b.value.id in modules
                    )
                    for b in c.bases
                )
            }
            if found <= enum_classes:
                break
            enum_classes |= found
        memberless = {c.name for c in classes if c.name in enum_classes and not _has_members(c)}
        self.enum_names = names | enum_classes
        pending: list[tuple[ast.expr, str]] = []
        pending += [(n, TYPE) for n in self.loads if n.id == "type"]
        pending += [(n, ENUM) for n in self.loads if n.id in names | memberless]
        pending += [
            (n, ENUM)
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and n.attr in _ENUM_FACTORIES
            and isinstance(n.value, ast.Name)
            and n.value.id in modules
        ]
        seen: set[tuple[int, str]] = set()  # a node may hold factories of two kinds
        while pending:
            node, kind = pending.pop()
            if (id(node), kind) not in seen:
                seen.add((id(node), kind))
                self.check(node, kind, pending)
        return self.found


def dynamic_class_uses(tree: ast.Module) -> list[tuple[ast.AST, str]]:
    """Each use of a class factory that could build a class at run time, with why."""
    return _Analysis(tree).run(tree)
