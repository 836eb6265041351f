"""The recorder encodes an object by its state, read without running any code of the object or its
class: two values that differ encode differently, whatever their ``__eq__`` says, and
``record.faithful`` tells an encoding that stands for the whole value from one that is cut or
opaque. The decoding's totality over any JSON is fuzzed in tests/tasks/test_coding_record.py."""

from __future__ import annotations

import ast
import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.coding import probe_runtime, probes, record
from tasks.coding.record import BadRecord
from tests.tasks.test_coding_probes import GOLD, entry, rewritten

RUNTIME = Path(probe_runtime.__file__)

# A module of the code under test, as the container imports it: every hook Python could call while
# reading an object records its name and raises.
HOSTILE_MODULE = '''
CALLS = []


def _hook(name):
    def method(*args, **kwargs):
        CALLS.append(name)
        raise RuntimeError(name)
    return method


class Meta(type):
    for _n in ("__getattribute__", "__getattr__", "__eq__", "__ne__", "__hash__", "__repr__",
               "__instancecheck__", "__subclasscheck__", "__len__", "__iter__", "__bool__"):
        locals()[_n] = _hook("meta " + _n)
    for _n in ("__name__", "__module__", "__mro__", "__dict__", "__bases__", "__base__", "__flags__"):
        locals()[_n] = property(_hook("meta " + _n))


class Plain:
    pass


ARMED = []


class Key(str):
    """A class dict key equal to "__module__": a lookup there would run its __eq__."""

    def __hash__(self):
        CALLS.extend(["key __hash__"] if ARMED else [])
        return str.__hash__(self)

    def __eq__(self, other):
        CALLS.extend(["key __eq__"] if ARMED else [])
        return str.__eq__(self, other)


Keyed = type("Keyed", (), {Key("__module__"): "forged", Key("x"): 1})


class Hostile(Plain, metaclass=Meta):
    __class__ = property(_hook("__class__"))
    __dict__ = property(_hook("__dict__"))  # hides the instance dict from Python code
    value = property(_hook("value"))
    for _n in ("__getattr__", "__getattribute__", "__eq__", "__ne__", "__hash__", "__repr__", "__str__",
               "__len__", "__iter__", "__bool__", "__reduce__", "__reduce_ex__", "__getstate__", "__dir__",
               "__format__", "__sizeof__", "__lt__", "__index__", "__int__", "__float__", "__getitem__"):
        locals()[_n] = _hook(_n)
    del _n


class Items(dict):
    for _n in ("items", "keys", "values", "__iter__", "__len__", "__getitem__", "get", "__eq__", "__repr__"):
        locals()[_n] = _hook("dict " + _n)
    del _n


def make(a, b):
    """A Hostile whose instance dict (a hostile dict subclass) holds ``a`` and ``b``."""
    h = object.__new__(Hostile)
    state = Items()
    dict.__setitem__(state, "a", a)
    dict.__setitem__(state, "b", b)
    Plain.__dict__["__dict__"].__set__(h, state)
    return h
'''

HOSTILE_SCRIPT = """
import json
import hostile_mod as m
import pqrl_probe_runtime as rt

values = [m.make(1, [2]), m.make(1, [3]), m.Hostile, [m.make(m.Hostile, {"k": 1})], m.Keyed(), m.Keyed]
del m.CALLS[:]
m.ARMED.append(True)
print(json.dumps({"encoded": [rt.encode(v) for v in values], "mro": rt._mro(m.Hostile), "calls": m.CALLS}))
"""


def run_in_container_fashion(
    tmp_path: Path, script: str, module: str = HOSTILE_MODULE, seed: str = "0"
) -> dict:
    """``script`` run by ``python3 -I`` next to the recorder uploaded as pqrl_probe_runtime.py, as
    the grading runner imports it."""
    shutil.copy(RUNTIME, tmp_path / "pqrl_probe_runtime.py")
    (tmp_path / "hostile_mod.py").write_text(module)
    (tmp_path / "script.py").write_text(f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n" + script)
    python = shutil.which("python3") or sys.executable
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": seed}
    done = subprocess.run(
        [python, "-I", "-B", str(tmp_path / "script.py")], capture_output=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def test_a_hostile_class_runs_none_of_its_code_and_keeps_its_state(tmp_path):
    out = run_in_container_fashion(tmp_path, HOSTILE_SCRIPT)
    assert out["calls"] == []
    first, second, cls, nested, keyed, keyed_class = out["encoded"]
    assert first == {"obj": "hostile_mod.Hostile", "state": {"a": 1, "b": {"list": [2], "len": 1}}}
    assert second["state"]["b"] == {"list": [3], "len": 1} and first != second
    assert cls == {"class": "hostile_mod.Hostile"}
    assert nested["list"][0]["state"]["a"] == {"class": "hostile_mod.Hostile"}
    assert out["mro"] == ["hostile_mod.Hostile", "hostile_mod.Plain", "builtins.object"]
    assert all(record.faithful(v) for v in out["encoded"][:4])
    assert keyed == {"obj": "?.Keyed"} and keyed_class == {"class": "?.Keyed"}  # its dict: not looked in


def test_encodings_are_the_same_in_every_run(tmp_path):
    """No ids, addresses or hash order: two interpreters with other hash seeds write the same."""
    script = """
import json, fractions
import pqrl_probe_runtime as rt

class P:
    def __init__(self, n):
        self.z, self.a, self.tags = n, str(n), {str(i) for i in range(n)}

print(json.dumps([rt.encode(v) for v in (P(5), {P(2), P(3)}, {"x": P(1), "y": fractions.Fraction(1, 3)})]))
"""
    runs = [run_in_container_fashion(tmp_path, script, seed=seed) for seed in ("1", "2", "3")]
    assert runs[0] == runs[1] == runs[2]
    assert list(runs[0][0]["state"]) == ["a", "tags", "z"]  # sorted, as the dict encoding is


@dataclasses.dataclass
class Point:
    x: int
    y: list


class Matrix:
    """Its ``__eq__`` says everything is equal: the edit the structural encoding defeats."""

    def __init__(self, rows):
        self.rows = rows

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


class Slotted:
    __slots__ = ("u", "v")


class MoreSlots(Slotted):
    __slots__ = ("u", "w")  # ``u`` again: a second slot of the same name, holding its own value


class Colour(enum.Enum):
    RED = 1
    GREEN = 2


class Rows(list):
    pass


Pair = collections.namedtuple("Pair", "a b")


def enc(v):
    return json.loads(json.dumps(probe_runtime.encode(v)))


def test_different_state_encodes_differently_equal_state_identically():
    assert enc(Matrix([[1, 2]])) != enc(Matrix([[1, 3]]))
    assert (
        enc(Matrix([[1, 2]]))
        == enc(Matrix([[1, 2]]))
        == {
            "obj": f"{__name__}.Matrix",
            "state": {"rows": {"list": [{"list": [1, 2], "len": 2}], "len": 1}},
        }
    )
    assert enc(Point(1, [2])) == {"obj": f"{__name__}.Point", "state": {"x": 1, "y": {"list": [2], "len": 1}}}
    assert enc(Point(1, [2])) != enc(Point(1, [2.5]))


def test_slots_enum_fraction_and_builtin_bases():
    s = MoreSlots()
    Slotted.__dict__["u"].__set__(s, "base u")
    s.u, s.w = "own u", 3  # ``v`` stays unset: skipped
    state = enc(s)["state"]
    assert state == {"u": "own u", "!slot1 u": "base u", "w": 3}
    assert enc(Colour.RED)["state"]["_value_"] == 1 and enc(Colour.RED) != enc(Colour.GREEN)
    assert enc(Colour.RED)["state"]["__objclass__"] == {"class": f"{__name__}.Colour"}
    assert enc(fractions.Fraction(2, 6)) == {
        "obj": "fractions.Fraction",
        "state": {"_denominator": 3, "_numerator": 1},
    }
    rows = Rows([1, 2])
    rows.label = "r"
    assert enc(rows) == {
        "obj": f"{__name__}.Rows",
        "base": {"list": [1, 2], "len": 2},
        "state": {"label": "r"},
    }
    assert enc(Pair(1, "b")) == {
        "obj": f"{__name__}.Pair",
        "base": {"tuple": [1, "b"], "len": 2},
        "state": {},
    }
    factory = collections.defaultdict(list, a=[1])
    assert enc(factory)["state"] == {"default_factory": {"class": "builtins.list"}}
    assert enc(factory)["base"]["dict"] == [['"a"', {"list": [1], "len": 1}]]
    assert enc(object()) == {"obj": "builtins.object", "state": {}}
    assert all(record.faithful(enc(v)) for v in (s, Colour.RED, fractions.Fraction(1, 3), rows, factory))


class Zone(datetime.tzinfo):
    """Its utcoffset is the code under test's: the recorder never calls it."""

    calls: list = []

    def utcoffset(self, dt):
        self.calls.append("utcoffset")
        return datetime.timedelta(hours=1)


class Day(datetime.date):
    pass


class Money(decimal.Decimal):
    pass


def test_stdlib_value_types_by_their_own_text_subclasses_opaque():
    when = datetime.datetime(2020, 1, 2, 3, 4, 5, 6)
    assert enc(when) == {"obj": "datetime.datetime", "state": "2020-01-02T03:04:05.000006"}
    assert enc(when.replace(fold=1))["state"].endswith(" fold=1")
    assert enc(datetime.date(2020, 1, 2))["state"] == "2020-01-02"
    assert enc(datetime.time(1, 2))["state"] == "01:02:00"
    assert enc(datetime.timedelta(days=1, seconds=5))["state"] == "1 day, 0:00:05"
    assert enc(decimal.Decimal("1.10")) == {"obj": "decimal.Decimal", "state": "1.10"}
    assert enc(decimal.Decimal("1.10")) != enc(decimal.Decimal("1.1"))
    utc = enc(when.replace(tzinfo=datetime.UTC))
    assert utc["tzinfo"] == {"obj": "datetime.timezone", "state": '0:00:00 "UTC"'}
    zoned = enc(when.replace(tzinfo=Zone()))
    assert Zone.calls == [] and zoned["tzinfo"] == {"obj": f"{__name__}.Zone", "state": {}}
    for sub in (Day(2020, 1, 2), Money("1.5")):  # C state in a subclass: out of reach, opaque
        assert enc(sub) == {"obj": f"{__name__}.{type(sub).__name__}"} and not record.faithful(enc(sub))
    assert all(record.faithful(enc(v)) for v in (when, utc, zoned, decimal.Decimal(3)))


def test_an_ordered_dict_by_its_order_only_when_its_keys_are_plain():
    first, second = collections.OrderedDict(a=1, b=2), collections.OrderedDict(a=1, b=2)
    second.move_to_end("a")
    assert enc(first) != enc(second) and record.faithful(enc(second))
    assert enc(second)["base"]["list"][0] == {"tuple": ["b", 2], "len": 2}
    ran = []

    class Key:
        def __hash__(self):
            ran.append("__hash__")
            return 1  # every key collides: a lookup would compare them with __eq__

        def __eq__(self, other):
            ran.append("__eq__")
            return self is other

    class Sub(collections.OrderedDict):  # none of its overrides runs: the C iteration reads it
        def _hook(self, *args, **kwargs):
            ran.append("override")
            raise RuntimeError

        __getitem__ = __iter__ = keys = items = values = __len__ = get = __contains__ = __eq__ = _hook

    sub = Sub()
    for key in "ab":
        collections.OrderedDict.__setitem__(sub, key, 1)
    collections.OrderedDict.move_to_end(sub, "a")
    assert enc(sub)["base"] == enc(collections.OrderedDict(b=1, a=1))["base"] and ran == []
    hostile = collections.OrderedDict([(Key(), 1), (Key(), 2)])
    big = collections.OrderedDict.fromkeys(range(2000))
    ran.clear()
    assert enc(hostile) == {"obj": "collections.OrderedDict"} and ran == []
    assert enc(big) == {"obj": "collections.OrderedDict"} and not record.faithful(enc(big))


class Node:
    def __init__(self):
        self.next = self
        self.others = [self, self]


def test_cycles_and_wide_objects_stay_bounded():
    loop = enc(Node())
    text = json.dumps(loop)
    assert '"cycle"' in text  # marked where it comes round, not expanded to the bounds
    assert len(text) < 3_000 and not record.faithful(loop)
    chain = None
    for _ in range(40):  # the most JSON nesting per level: an object holding an OrderedDict
        node = Node()
        node.next = collections.OrderedDict(k=chain)
        chain = node
    line = json.dumps({"t": "t", "s": 0, "v": [enc(chain), loop]}).encode()
    assert len(probes.parse_record(line)["t"]) == 1  # within the host's nesting bound
    wide = Matrix(None)
    for i in range(100_000):
        setattr(wide, f"a{i}", i)
    started = time.monotonic()
    encoded = enc([wide] * 50)
    assert time.monotonic() - started < 10
    first = encoded["list"][0]
    assert first["len"] == 100_001 and len(first["state"]) == probe_runtime._MAX_ITEMS
    assert not record.faithful(first) and len(json.dumps(encoded)) < 5_000_000


class Deque(collections.deque):
    pass


class NoDictGetset:
    __dict__ = property(lambda self: {})  # the first class with a dict hides its getset


class Copied:
    __dict__ = NoDictGetset.__dict__["__weakref__"]  # another class's C getset, under this name


class CopiedDict:
    __dict__ = Matrix.__dict__["__dict__"]  # a genuine dict getset, but Matrix's


class Keys:
    pass


class Omits(type):
    def mro(cls):  # leaves the C base out of the MRO: the bases still show it
        return [cls, object]


def test_state_out_of_reach_is_opaque_never_partial():
    sneaky = Omits("Sneaky", (collections.deque,), {})
    assert probe_runtime._MRO(sneaky) == (sneaky, object)
    for value in (Deque([1]), NoDictGetset(), Copied(), CopiedDict(), sneaky()):
        encoded = enc(value)
        assert "state" not in encoded and not record.faithful(encoded), value
    keys = Keys()
    vars(keys).update({5: "int", "!x": "bang", "x": "plain", "k" * 20_000: "long"})
    state = enc(keys)["state"]
    assert state["!key 5"] == "int" and state["!!x"] == "bang" and state["x"] == "plain"
    assert enc(keys)["len"] == 4 and not record.faithful(enc(keys))  # a key that is not a name: marked
    odd = type("Odd", (), {5: "not a str key"})  # a class dict key that is not a str
    assert enc(odd()) == {"obj": "?.Odd"} and enc(odd) == {"class": "?.Odd"}  # its module: not looked up


def test_functions_methods_and_modules_stay_opaque():
    for value in (len, lambda: 1, Node().__init__, json, range(3)):
        encoded = enc(value)
        assert set(encoded) == {"obj"} and not record.faithful(encoded)


def test_the_recorder_stays_python37_syntax():
    ast.parse(RUNTIME.read_text(), feature_version=(3, 7))


# ---------------------------------------------------------------- the host side


def test_decode_takes_the_new_shapes_as_opaque_and_refuses_malformed_ones():
    for good in (enc(Point(1, [2])), enc(Point), enc(datetime.date(2020, 1, 2)), enc(Rows([1])), enc(len)):
        assert isinstance(record.decode(good), record.Opaque)
    bad = [
        {"obj": 5},
        {"obj": "m.C", "state": [1]},
        {"obj": "m.C", "state": {"a": {"int": []}}},
        {"obj": "m.C", "state": {"a": {"set": [5]}}},
        {"obj": "m.C", "state": "x" * 20_000},
        {"obj": "m.C", "base": {"bytes": "zz"}},
        {"obj": "m.C", "tzinfo": [1]},
        {"obj": "m.C", "len": -1},
        {"obj": "m.C", "len": True},
        {"obj": "m.C", "extra": 1},
        {"obj": "x" * 30_000},
        {"class": 5},
        {"class": "m.C", "state": {}},
    ]
    for value in bad:
        with pytest.raises(BadRecord):
            record.decode(value)
        assert record.faithful(value) is False


def test_faithful_on_each_shape():
    yes = [1, 2.5, float("nan"), "s", None, True, [1], {"a": [1, 2]}, (1, 2), {1, 2}, frozenset({"x"}),
           b"ab", 2**80, 1j, Point(1, [2]), Point, fractions.Fraction(1, 2), datetime.date(2020, 1, 1),
           decimal.Decimal(1)]  # fmt: skip
    no = ["x" * 20_000, 1 << 100_000, list(range(2000)), set(range(2000)), b"x" * 20_000, len, Deque(),
          Point(len, [1]), {"k": json}]  # fmt: skip
    assert [v for v in yes if not record.faithful(enc(v))] == []
    assert [v for v in no if record.faithful(enc(v))] == []
    markers = [{"cut": True}, {"deep": "m.C"}, {"unencodable": ["m.E"]}, {"!truth": True}, {"!raised": None}]
    forged = [{"list": [1]}, {"list": [1], "len": 2}, {"bytes": "ab", "len": 3}, {"str": "x", "len": 1}, [1]]
    assert not any(record.faithful(v) for v in markers + forged)
    for weird in (
        float("inf"),
        {"set": ["[" * 10_000]},
        {"obj": "m.C", "state": {"a": {"deep": "x"}}},
        object(),
    ):
        assert record.faithful(weird) is False


def test_the_host_tells_objects_apart_by_state_and_tolerates_state_that_varies():
    """Site 7 of the probes' test is ``assert a == b``, both computed: the process reports the
    truth, the states are compared with the gold run's. A ``__eq__`` that says "equal" no longer
    carries a wrong value; a state that varies between the two gold runs is tolerated."""

    def record_with(a, b):
        return {"t": [e if e[0] != 7 else entry(7, enc(a), enc(b), {"!truth": True}) for e in GOLD["t"]]}

    def judge(gold, got, unstable=frozenset()):
        return probes.compare(gold, got, rewritten().sites, ["t"], unstable)

    gold = record_with(Matrix([[1, 2]]), Matrix([[1, 2]]))
    assert judge(gold, record_with(Matrix([[1, 2]]), Matrix([[1, 2]]))) == {}
    assert judge(gold, record_with(Matrix([[9, 9]]), Matrix([[1, 2]]))) == {
        "t": "the check at tests/test_m.py:21 failed"
    }
    second_gold = record_with(Matrix([[1, 3]]), Matrix([[1, 2]]))  # e.g. a timestamp in the state
    unstable, tests = probes.unstable_entries(gold, second_gold)
    assert unstable == {("t", 7)} and tests == set()
    assert judge(gold, record_with(Matrix([[9, 9]]), Matrix([[1, 2]])), unstable) == {}
    assert probes.unstable_entries(gold, record_with(Matrix([[1, 2]]), Matrix([[1, 2]]))) == (set(), set())
