"""The source policy against ways to reach builtins through objects and run-time attribute names,
and every built-in task's gold patch, applied by git, against the policy."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tasks.coding.diffs import split_patch
from tasks.coding.generate import SUITE_PATH
from tasks.coding.policy import check_source
from tasks.suite import load_suite

DUNDER_GLOBALS = "'_' * 2 + 'globals' + '_' * 2"
BYPASSES = {
    # functools.wraps / update_wrapper copy attributes named at run time (module globals -> sys)
    "wraps_runtime_dunder": (
        "import functools\n\n\ndef _h():\n    pass\n\n\n"
        f"functools.wraps(len, assigned=({DUNDER_GLOBALS},))(_h)\n"
    ),
    "wraps_from_import": "from functools import wraps\n",
    "update_wrapper": (
        "import functools\n\n\ndef _h():\n    pass\n\n\n"
        f"functools.update_wrapper(_h, len, ({DUNDER_GLOBALS},), ())\n"
    ),
    # a builtin taken as an attribute of a module object reached at run time
    "attribute_call_getattr": "def f(m, x):\n    return m.getattr(x, 'y')\n",
    "attribute_call_eval": "def f(holder):\n    return holder._b.eval('1')\n",
    "attribute_open": "def f(m):\n    return m.open('/tmp/report.xml', 'w')\n",
    "attribute_setattr": "def f(m, o):\n    m.setattr(o, 'x', 1)\n",
    "attribute_exec": "def f(m):\n    return m.exec('import os')\n",
    # the builtins module under an alias
    "alias_builtins_module": "def f(holder):\n    b = holder.builtins\n    return b.len\n",
    "private_alias_builtins_module": "def f(h):\n    b = h._builtins\n    return b\n",
    "name_builtins": "def f(builtins):\n    return builtins\n",
    # getattr looked up by name in a namespace: vars(builtins), __builtins__, a dict reached at run time
    "vars_of_builtins": "def f(m):\n    return vars(m)['get' + 'attr']\n",
    "dunder_builtins": "g = __builtins__['getattr']\n",
    "namespace_subscript": "def f(ns):\n    return ns['getattr'](1, 'real')\n",
    "namespace_get": "def f(ns):\n    return ns.get('eval')\n",
    "class_pattern_attribute": "def f(m):\n    match m:\n        case object(getattr=g):\n"
    "            return g\n",
}
STILL_ALLOWED = [
    "import re\nP = re.compile('a+')\n",
    "import functools\n\n\n@functools.lru_cache(maxsize=None)\ndef f(n):\n    return n\n",
    "from functools import partial, reduce\n\nadd = partial(reduce, lambda a, b: a + b)\n",
    "def f(d):\n    return d['open'], d['exit'], d.getter\n",
]


@pytest.mark.parametrize("source", BYPASSES.values(), ids=BYPASSES.keys())
def test_every_bypass_form_is_flagged(source):
    violations = check_source("m.py", source.encode(), b"")
    assert {v.rule for v in violations} & {"builtin", "import", "introspection"}, violations


@pytest.mark.parametrize("source", STILL_ALLOWED)
def test_plain_code_near_the_bypasses_still_passes(source):
    assert check_source("m.py", source.encode(), b"") == []


def test_every_gold_patch_passes_the_policy(tmp_path: Path):
    """Each of the built-in tasks' gold patches, applied to its buggy repository by git, leaves
    sources that the policy accepts: the tightened rules refuse no correct solution here."""
    tasks = load_suite(SUITE_PATH).tasks
    assert len(tasks) >= 66
    for task in tasks:
        root = tmp_path / task.id
        for path, content in task.repo.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(content)
        (root / "gold.diff").write_text(task.gold_patch or "")
        subprocess.run(["git", "apply", "gold.diff"], cwd=root, check=True, capture_output=True)
        for part in split_patch(task.gold_patch or ""):
            patched = (root / part.new_path).read_bytes()
            assert patched != task.repo[part.new_path].encode()
            original = task.repo[part.new_path].encode()
            assert check_source(part.new_path, patched, original) == [], task.id


EQ = "'_' * 2 + 'eq' + '_' * 2"  # a dunder key the source never spells
ENUM_B = "from enum import Enum\n\n\nclass B(Enum):\n"
# Every spelling that reaches type.__new__ with a name, bases and namespace (or the enum
# functional API, or __build_class__), so a class gets a dunder the source never defines.
CLASS_BUILDERS = {
    "type_three": f"A = type('A', (), {{{EQ}: lambda s, o: True}})\n",
    "type_of_int": f"A = type(int)('A', (), {{{EQ}: lambda s, o: True}})\n",
    "type_of_type_of": "def f(x):\n    return type(type(x))('A', (), {})\n",
    "type_alias": "t = type\nA = t('A', (), {})\n",
    "type_starred": "args = ('A', (), {})\nA = type(*args)\n",
    "type_kwargs": "A = type('A', (), {}, **{})\n",
    "metaclass_in_local": "def f(x):\n    m = type(x)\n    return m('A', (), {})\n",
    "metaclass_walrus": "def f(x):\n    if m := type(x):\n        return m('A', (), {})\n",
    "metaclass_closure": "def f(x):\n    m = type(x)\n\n    def g():\n        return m('A', (), {})\n\n"
    "    return g()\n",
    "metaclass_global": "def f(x):\n    global M\n    M = type(x)\n\n\ndef g():\n    return M('A', (), {})\n",
    "metaclass_class_attribute": "class C:\n    m = type(int)\n",
    "metaclass_attribute_store": "class H:\n    def set(self, x):\n        self.m = type(x)\n",
    "map_type": "A = list(map(type, ['A'], [()], [{}]))\n",
    "partial_type": "from functools import partial\n\nmk = partial(type, 'A')\n",
    "starmap_metaclass": "import itertools\n\nA = list(itertools.starmap(type(int), [('A', (), {})]))\n",
    "keyword_type": "from functools import reduce\n\nr = reduce(function=type, iterable=[])\n",
    "return_metaclass": "def meta(x):\n    return type(x)\n",
    "lambda_metaclass": "mk = lambda x: type(x)\n",
    "ifexp_metaclass": "def f(x, c):\n    m = type(x) if c else None\n    return m\n",
    "unpacked_metaclass": "def f(x):\n    a, b = type(x), 1\n    return a\n",
    "subclass_type": "class M(type):\n    pass\n",
    "subclass_metaclass": "class M(type(int)):\n    pass\n",
    "generic_alias_call": "A = type[int]('A', (), {})\n",
    "metaclass_of_a_class_argument": "A = type(int)(int)('A', (), {})\n",
    "metaclass_through_a_parameter": "def meta(c):\n    return type(c)(c)\n",
    "own_type_of_a_value_returned": "def f(self, v):\n    return type(self)(v)\n",
    "signature_annotation_runs_code": "def g(t):\n    return t\n\n\ndef f(x: g(type)):\n    pass\n",
    "signature_annotation_call": "def f(x: type('A', (), {})):\n    pass\n",
    "index_of_user_value": ENUM_B + "    pass\n\n\ndef f(d):\n    return d[B]\n",
    "operator_with_user_value": "def f(v):\n    return v | type\n",
    "type_in_list": "fs = [type]\n",
    "type_decorator": "@type\ndef f():\n    pass\n",
    "dataclass_field_type": "from dataclasses import dataclass\n\n\n@dataclass\nclass C:\n"
    "    k: type = int\n",
    "compared_with_user_value": "def f(v):\n    return v == type or type(v) in [v]\n",
    "contained_in_user_value": "def f(c):\n    return type in c\n",
    "class_name_rebound": "class V:\n    pass\n\n\nV = V()\n\n\ndef f(a):\n    return type(a) == V\n",
    "shadowed_int": "int = None\n\n\ndef f(x):\n    return type(x) == int\n",
    "default_argument": "def f(t=type):\n    return t\n",
    "shadowed_isinstance": "def isinstance(a, b):\n    return b('A', (), {})\n\n\nisinstance(1, type)\n",
    "enum_functional": f"from enum import Enum\n\nE = Enum('E', {{{EQ}: lambda s, o: True}})\n",
    "enum_module_functional": "import enum\n\nE = enum.Enum('E', 'a b')\n",
    "enum_names_keyword": "from enum import IntEnum\n\nE = IntEnum('E', names='a b')\n",
    "enum_alias": "from enum import Flag as F\n\ng = F\nE = g('E', 'a')\n",
    "memberless_enum_functional": ENUM_B + "    f = lambda s: 0\n\n\nE = B('E', {})\n",
    "memberless_enum_passed": ENUM_B + "    pass\n\n\ndef f(g):\n    return g(B)\n",
    "enum_members_ignored": ENUM_B + "    _ignore_ = ['A']\n    A = 1\n\n\nE = B('E', {})\n",
    "enum_member_deleted": ENUM_B + "    A = 1\n    del A\n\n\nE = B('E', {})\n",
    "enum_base_under_alias": "from enum import Enum\n\nx = Enum\n\n\nclass B(x):\n    pass\n\n\n"
    "E = B('E', {})\n",
    "two_kinds_in_one_name": ENUM_B + "    pass\n\n\ndef f(x):\n    t = B\n    t = type(int)\n"
    "    return t[int]\n",
    "enum_create": ENUM_B + "    A = 1\n\n\nE = B._create_('E', {})\n",
    "enum_convert": ENUM_B + "    A = 1\n\n\nE = B._convert_('E', 'm', len)\n",
    "build_class": "C = __build_class__(lambda: None, 'C')\n",
    "metaclass_keyword": "class A(metaclass=type):\n    pass\n",
    "types_new_class": "import types\n\nA = types.new_class('A')\n",
}
# What a correct solution writes with type() and enums: looking a type up, comparing it, making
# an instance of one, testing against one, and enums with members.
CLASS_USES_ALLOWED = {
    "isinstance_type": "def f(x):\n    return isinstance(x, type) or isinstance(x, (int, type))\n",
    "compare_types": "def f(a, b):\n    return type(a) is type(b) and type(a) == int\n",
    "type_in_builtins": "def f(a):\n    return type(a) in (list, tuple, 'x')\n",
    "own_class": "class V:\n    pass\n\n\ndef f(a):\n    return type(a) == V or type(a) in (V, 1)\n",
    "identity_with_anything": "def f(a, b):\n    return type(a) is b or type is not b\n",
    "isinstance_own_type": "def same(a, b):\n    return isinstance(b, type(a))\n",
    "instance_of_own_type": "class V:\n    def __init__(self, v):\n        self.v = v\n\n"
    "    def twice(self):\n        return type(self)([x * 2 for x in self.v]), type(self)(1, 2)\n",
    "formatted_and_named": "def f(x):\n    return f'{type(x)}', str(type(x)), repr(type)\n",
    "type_name": "def f(x):\n    return type(x).__name__\n",
    "local_class": "class V:\n    def __init__(self, v):\n        self.v = v\n\n    def copy(self):\n"
    "        cls = type(self)\n        return cls([self.v])\n\n"
    "    @classmethod\n    def make(cls, a, b, c):\n        return cls(a + b + c)\n",
    "annotations": "def f(t: type, k: 'type') -> type:\n    x: type = int\n    return x\n",
    "future_annotations": "from __future__ import annotations\n\nfrom dataclasses import dataclass\n\n\n"
    "@dataclass\nclass C:\n    k: type\n",
    "enum_with_members": "from enum import Enum, auto\n\n\nclass Color(Enum):\n    RED = 1\n"
    "    GREEN = auto()\n\n\n"
    "def f(v):\n    return Color(v), Color['RED'], list(Color), Color.RED.value\n",
    "enum_subclass": "from enum import Enum\n\n\nclass B(Enum):\n    pass\n\n\nclass C(B):\n    X = 1\n\n\n"
    "def f(v):\n    return C(v), isinstance(v, B)\n",
    "reraise_same_type": "def f(e):\n    raise type(e)('again')\n",
}


@pytest.mark.parametrize("source", CLASS_BUILDERS.values(), ids=CLASS_BUILDERS.keys())
def test_every_way_to_build_a_class_at_run_time_is_flagged(source):
    compile(source, "m.py", "exec")  # each is valid Python
    violations = check_source("m.py", source.encode(), b"")
    assert {v.rule for v in violations} & {"class", "introspection", "import"}, violations


@pytest.mark.parametrize("source", CLASS_USES_ALLOWED.values(), ids=CLASS_USES_ALLOWED.keys())
def test_plain_uses_of_type_and_enums_pass(source):
    assert check_source("m.py", source.encode()) == []


def test_the_flagged_forms_really_build_a_class_with_a_dunder():
    """The attacks are real: each of these gives a class an __eq__ that its source never spells."""
    for source in ("type_of_int", "enum_functional"):
        namespace: dict = {}
        exec(CLASS_BUILDERS[source], namespace)
        built = namespace["A"] if "A" in namespace else namespace["E"]
        assert isinstance(built, type) and "__eq__" in vars(built)
