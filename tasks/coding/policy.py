"""The source policy: a static check of every patched source file before any of it runs.

Hidden tests run in the same Python process as the code under test, so that code could rewrite
pytest's verdicts (monkeypatch ``_pytest``, ``unittest`` or ``builtins``), end the process early
(``os._exit``, ``sys.exit``), register exit hooks (``atexit``) or write the report itself. No
runtime boundary inside one process stops that, so the grader refuses, before running anything,
patched code that steps outside plain computation. The rules, enforced on the AST:

- imports: only ``from __future__``, and whitelisted standard-library modules and names
  (``ALLOWED_IMPORTS``); no relative, dotted or star imports. A module imported whole may only
  be used as ``module.name`` with a whitelisted name, never stored into or passed around;
- builtins that reach the interpreter are banned by name (``eval``, ``exec``, ``open``,
  ``getattr``, ``globals``, ``__import__``, ``breakpoint``, ``exit``...), as attributes of
  anything (``m.getattr``: a module object reached at run time holds them too) but a whitelisted
  ``module.name``, and as string constants (``ns["getattr"]``); so is any name or attribute that
  spells ``builtins``, and raising ``SystemExit``/``KeyboardInterrupt``/``BaseException``/
  ``GeneratorExit``. Nothing whitelisted reads or copies attributes named at run time
  (``functools.wraps``/``update_wrapper`` would: ``__globals__`` spelled at run time reaches
  ``sys``);
- introspection: no dunder names or attributes beyond ``__init__``/``__name__``/``__doc__``/
  ``__qualname__``/``__all__``/``__slots__``, no frame/code/traceback attributes (``f_*``,
  ``tb_*``, ``gi_*``, ``co_*``...), no string constant that spells a dunder name, private
  (``_x``) attributes only on plain names that are not imports, and no attribute assignment on
  imported names;
- ``match`` class patterns and keyword arguments follow the same attribute rules (``case
  C(__class__=x)`` reads an attribute without an Attribute node);
- classes: no metaclass or class keywords, no class built at run time (``type``, a metaclass
  from ``type(x)`` or the enum functional API used where it could build one, and no enum sunder
  attributes such as ``_create_``: tasks/coding/policy_classes.py); only value-semantics
  dunder methods, and none that the original file did not define for that class (an ``__eq__``
  that always returns True would satisfy ``assert f(x) == y``);
- the file is UTF-8 without a foreign coding cookie, at most 256 KiB, and parses.

What it leaves open is stated in the coding grader's docstring (tasks/coding/grader.py).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from tasks.coding.policy_classes import dynamic_class_uses

__all__ = ["ALLOWED_IMPORTS", "MAX_SOURCE_BYTES", "Violation", "check_source"]

MAX_SOURCE_BYTES = 256 << 10


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


ALLOWED_IMPORTS: dict[str, frozenset[str]] = {
    name: _words(names)
    for name, names in {
        "math": "acos acosh asin asinh atan atan2 atanh cbrt ceil comb copysign cos cosh degrees dist e exp "
        "exp2 expm1 fabs factorial floor fmod frexp fsum gamma gcd hypot inf isclose isfinite isinf isnan "
        "isqrt lcm ldexp lgamma log log10 log1p log2 modf nan nextafter perm pi pow prod radians remainder "
        "sin sinh sqrt tan tanh tau trunc ulp",
        "re": "compile match fullmatch search findall finditer sub subn split escape error Pattern Match "
        "IGNORECASE I MULTILINE M DOTALL S VERBOSE X ASCII A",
        "string": "ascii_letters ascii_lowercase ascii_uppercase digits hexdigits octdigits punctuation "
        "whitespace printable capwords",
        "collections": "OrderedDict defaultdict deque Counter",
        "dataclasses": "dataclass field replace asdict astuple fields FrozenInstanceError InitVar KW_ONLY",
        "typing": "Any Callable ClassVar Dict Final FrozenSet Generic Hashable Iterable Iterator List "
        "Literal Mapping MutableMapping Optional Protocol Sequence Set Tuple TypeVar Union cast overload",
        "functools": "total_ordering reduce lru_cache cache cached_property partial",
        "itertools": "accumulate chain combinations combinations_with_replacement compress count cycle "
        "dropwhile filterfalse groupby islice pairwise permutations product repeat starmap takewhile tee "
        "zip_longest",
        "heapq": "heappush heappop heapify heapreplace heappushpop nlargest nsmallest merge",
        "bisect": "bisect bisect_left bisect_right insort insort_left insort_right",
        "enum": "Enum IntEnum Flag IntFlag auto unique",
        "fractions": "Fraction",
        "decimal": "Decimal ROUND_HALF_UP ROUND_HALF_EVEN ROUND_DOWN ROUND_UP ROUND_FLOOR ROUND_CEILING "
        "InvalidOperation DivisionByZero",
        "datetime": "date datetime time timedelta timezone MINYEAR MAXYEAR",
        "abc": "ABC abstractmethod",
    }.items()
}
_BANNED_NAMES = _words(
    "eval exec compile open __import__ globals locals vars dir getattr setattr delattr breakpoint input "
    "exit quit help memoryview copyright credits license SystemExit KeyboardInterrupt BaseException "
    "GeneratorExit"
)
# Reach the interpreter when looked up by string (``d["getattr"]`` on a builtins namespace).
_BANNED_STRINGS = _words(
    "eval exec compile globals locals vars getattr setattr delattr __import__ breakpoint builtins"
)
_BUILTINS_MODULE = re.compile(r"builtins", re.IGNORECASE)
_SAFE_DUNDER_ATTRS = frozenset({"__init__", "__name__", "__doc__", "__qualname__"})
_SAFE_DUNDER_NAMES = frozenset({"__name__", "__all__", "__slots__"})
_VALUE_DUNDERS = _words(
    "__init__ __post_init__ __repr__ __str__ __format__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__ __hash__ "
    "__bool__ __len__ __iter__ __next__ __reversed__ __contains__ __getitem__ __setitem__ __delitem__ "
    "__add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ __rmul__ __imul__ __matmul__ __rmatmul__ "
    "__truediv__ __rtruediv__ __floordiv__ __rfloordiv__ __mod__ __rmod__ __pow__ __rpow__ __neg__ "
    "__pos__ __abs__ __invert__ __and__ __or__ __xor__ __index__ __int__ __float__ __round__ __enter__ "
    "__exit__ __call__ __copy__"
)
_FRAME_ATTR = re.compile(r"(f|tb|gi|cr|ag|co|func|im)_\w+|mro|with_traceback")
_DUNDER = re.compile(r"__\w+__")
_SUNDER = re.compile(r"_[^_]\w*_")
_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.MULTILINE)


@dataclass(frozen=True)
class Violation:
    """One broken rule: where, which rule, and what was found."""

    path: str
    line: int
    rule: str  # "syntax" is a broken solution, not an attempt to game the grader
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.detail}"


def _dunder_methods(tree: ast.Module) -> set[tuple[str, str]]:
    return {
        (cls.name, fn.name)
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for fn in cls.body
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and _DUNDER.fullmatch(fn.name)
    }


class _Checker(ast.NodeVisitor):
    def __init__(self, path: str, original_dunders: set[tuple[str, str]] | None) -> None:
        self.path = path
        self.original_dunders = original_dunders
        self.found: list[Violation] = []
        self.modules: dict[str, str] = {}  # local name -> module imported whole
        self.imported: set[str] = set()  # names bound by from-imports
        self.allowed_module_uses: set[int] = set()  # ids of Name nodes used as module.attr

    def bad(self, node: ast.AST, rule: str, detail: str) -> None:
        self.found.append(Violation(self.path, getattr(node, "lineno", 0), rule, detail))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name not in ALLOWED_IMPORTS:
                self.bad(node, "import", f"module {alias.name!r} is not allowed")
            else:
                self.modules[alias.asname or alias.name] = alias.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "__future__" and node.level == 0:
            return
        allowed = ALLOWED_IMPORTS.get(node.module or "") if node.level == 0 else None
        for alias in node.names:
            if allowed is None or alias.name not in allowed:
                where = "." * node.level + (node.module or "")
                self.bad(node, "import", f"'from {where} import {alias.name}' is not allowed")
            else:
                self.imported.add(alias.asname or alias.name)

    def _attribute_name(self, node: ast.AST, attr: str) -> bool:
        """Checks an attribute read by name; True when it is fine so far."""
        if _DUNDER.fullmatch(attr) and attr not in _SAFE_DUNDER_ATTRS:
            self.bad(node, "introspection", f"attribute {attr!r}")
        elif _FRAME_ATTR.fullmatch(attr):
            self.bad(node, "introspection", f"attribute {attr!r} (frames, code and tracebacks)")
        elif _SUNDER.fullmatch(attr) and attr not in ("_value_", "_name_"):
            self.bad(node, "class", f"attribute {attr!r} (enum machinery: _create_ builds a class)")
        else:
            return True
        return False

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for attr in node.kwd_attrs:  # `case C(attr=x)` reads x.attr without an Attribute node
            if attr in _BANNED_NAMES or _BUILTINS_MODULE.search(attr):
                self.bad(node, "builtin", f"attribute {attr!r} in a class pattern")
            elif self._attribute_name(node, attr) and attr.startswith("_"):
                self.bad(node, "introspection", f"private attribute {attr!r} in a class pattern")

    def visit_Call(self, node: ast.Call) -> None:
        for kw in node.keywords:
            if kw.arg is not None and _DUNDER.fullmatch(kw.arg):
                self.bad(node, "introspection", f"keyword argument {kw.arg!r}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr, base = node.attr, node.value
        if isinstance(base, ast.Name) and base.id in self.modules:
            self.allowed_module_uses.add(id(base))
            module = self.modules[base.id]
            if attr not in ALLOWED_IMPORTS[module]:
                self.bad(node, "import", f"{module}.{attr} is not allowed")
            if not isinstance(node.ctx, ast.Load):
                self.bad(node, "monkeypatch", f"assignment to {module}.{attr}")
        elif attr in _BANNED_NAMES or _BUILTINS_MODULE.search(attr):
            self.bad(node, "builtin", f"attribute {attr!r} (a builtin reached through an object)")
        elif self._attribute_name(node, attr) and attr.startswith("_") and not _DUNDER.fullmatch(attr):
            plain = isinstance(base, ast.Name) and base.id not in self.imported
            if not plain:
                self.bad(
                    node, "introspection", f"private attribute {attr!r} of something other than a plain name"
                )
        if not isinstance(node.ctx, ast.Load) and isinstance(base, ast.Name) and base.id in self.imported:
            self.bad(node, "monkeypatch", f"assignment to an attribute of imported {base.id!r}")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in _BANNED_NAMES:
            self.bad(node, "builtin", f"{node.id!r} is not allowed")
        elif _DUNDER.fullmatch(node.id) and node.id not in _SAFE_DUNDER_NAMES:
            self.bad(node, "introspection", f"name {node.id!r}")
        elif _BUILTINS_MODULE.search(node.id):
            self.bad(node, "builtin", f"{node.id!r} (the builtins module under some name)")
        elif node.id in self.modules and id(node) not in self.allowed_module_uses:
            self.bad(node, "import", f"module {node.id!r} may only be used as {node.id}.<name>")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str | bytes):
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            if _DUNDER.search(text):
                self.bad(node, "introspection", f"string constant spelling a dunder name: {text[:60]!r}")
            elif text.strip() in _BANNED_STRINGS:
                self.bad(node, "builtin", f"string constant naming a builtin: {text.strip()!r}")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.keywords:
            self.bad(node, "class", f"class {node.name} has keywords (metaclass=...)")
        for fn in node.body:
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and _DUNDER.fullmatch(fn.name):
                if fn.name not in _VALUE_DUNDERS:
                    self.bad(fn, "class", f"{node.name}.{fn.name} is not allowed")
                elif self.original_dunders is not None and (node.name, fn.name) not in self.original_dunders:
                    self.bad(fn, "class", f"{node.name}.{fn.name} is new (the original does not define it)")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if _DUNDER.fullmatch(node.name) and node.col_offset == 0:
            self.bad(node, "introspection", f"module-level {node.name}")

    visit_AsyncFunctionDef = visit_FunctionDef


def _parse(path: str, source: bytes) -> tuple[ast.Module | None, list[Violation]]:
    if len(source) > MAX_SOURCE_BYTES:
        return None, [Violation(path, 0, "size", f"{len(source)} bytes is over {MAX_SOURCE_BYTES}")]
    cookie = _COOKIE.search(b"\n".join(source.splitlines()[:2]))
    if cookie and cookie.group(1).lower().replace(b"_", b"-") not in (b"utf-8", b"utf8"):
        return None, [Violation(path, 1, "encoding", f"coding cookie {cookie.group(1).decode()!r}")]
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, [Violation(path, 0, "encoding", f"not UTF-8: {e}")]
    try:
        return ast.parse(text, filename=path), []
    except (SyntaxError, ValueError) as e:
        return None, [Violation(path, getattr(e, "lineno", 0) or 0, "syntax", str(e)[:500])]
    except (RecursionError, MemoryError):  # nested past the parser's limits: Python cannot compile it either
        return None, [Violation(path, 0, "syntax", "nested too deeply to parse")]


def check_source(path: str, source: bytes, original: bytes | None = None) -> list[Violation]:
    """Every policy violation in ``source`` (empty when it may run). ``original``, the file as
    shipped, fixes which dunder methods each class may define."""
    tree, problems = _parse(path, source)
    if tree is None:
        return problems
    original_dunders = None
    if original is not None:
        original_tree, _ = _parse(path, original)
        original_dunders = _dunder_methods(original_tree) if original_tree is not None else set()
    checker = _Checker(path, original_dunders)
    # Imports first, so uses of an imported name anywhere in the file are judged against them.
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            checker.visit(node)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom | ast.Name):
            method = getattr(checker, "visit_" + type(node).__name__, None)
            if method is not None:
                method(node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            checker.visit_Name(node)
    for node, detail in dynamic_class_uses(tree):
        checker.bad(node, "class", detail)
    return sorted(checker.found, key=lambda v: (v.line, v.rule, v.detail))
