"""The recorder the rewritten hidden tests call inside the grading container (standard library
only; uploaded as ``pqrl_probe_runtime``). tasks/coding/probes.py explains the scheme.

Each rewritten assert calls ``probe(site, ops, *thunks)``; each ``pytest.raises`` block is
``with raises(site)``. One JSON line per call goes to the descriptor in ``PQRL_PROBE_FD`` (a pipe
the runner reads): ``{"t": test id, "s": site, "v": [encoded values]}``. Nothing is compared here:
the expected values are on the host. The code under test can write into this pipe too; that gains
it nothing unless it knows the values the correct code computes.

What a value is recorded as (``encode``): builtin values by content; a class by its module and
qualified name (``{"class": ...}``); an exact ``datetime`` date/datetime/time/timedelta/timezone or
``decimal.Decimal`` by the text its own C method writes (``{"obj": name, "state": text}``, a
tzinfo encoded apart); any other object by its type's name and its state: the instance dict and
the slots that are set, each value encoded in turn (``{"obj": name, "state": {name: value}}``),
with a builtin base's value (``"base"``) for a subclass of int, str, list, dict, ... (an
OrderedDict's: its items in order, when its keys are plain builtin values). Where the
state is out of reach (an ancestor is a C class holding its own fields, e.g. a deque, a function,
a module; or a class hides its instance dict's getset), ``"state"`` is left out: the object is
opaque. What runs while a value is encoded: only C code of the interpreter (``type()``, the C
slots of builtin base types, the C getsets and member descriptors of ``type``, of the descriptors
and of the classes that define the state, iterating dicts and class dicts without looking a key
up). Nothing the code under test defines runs: no ``__eq__``, ``__hash__``, ``__repr__``,
``__getattribute__``, property, metaclass attribute or ``__class__``.
"""

import collections
import datetime
import decimal
import itertools
import json
import math
import os
import threading
import types

_FD = int(os.environ.get("PQRL_PROBE_FD", "-1"))
_MAX_ITEMS = 1000  # per container: longer ones are cut (and marked), the gold record is cut alike
_MAX_STR = 10000
_MAX_DEPTH = 20
# The record's size, under the runner's 8 MiB (tasks/coding/runner.py), and a test's share of it:
# past either one "!overflow" entry, then nothing more from that test (or from any, past the
# record's), never a line cut short. Such a test is judged by its outcome; so is every later one
# once the record is full.
_MAX_RECORD, _MAX_TEST = 6 << 20, 512 << 10
_LEFT = [_MAX_RECORD, None, _MAX_TEST]  # bytes left in the record, the test recording, its bytes left
_LOCK = threading.Lock()  # one line at a time: threads of the code under test probe too
COMPARISONS = {  # also the host's, when it evaluates an assert on recorded values
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "is": lambda a, b: a is b,
    "is not": lambda a, b: a is not b,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
}


_MAX_NODES = 100000  # values encoded per operand (16 characters count as one): past it, cut and marked
# The fields of classes and descriptors, read through type's and the descriptors' own C getsets and
# members: never a metaclass property or anything else the code under test defines.
_NAME = type.__dict__["__name__"].__get__
_QUALNAME = type.__dict__["__qualname__"].__get__
_MODULE = type.__dict__["__module__"].__get__
_MRO = type.__dict__["__mro__"].__get__
_BASES = type.__dict__["__bases__"].__get__
_BASE = type.__dict__["__base__"].__get__
_FLAGS = type.__dict__["__flags__"].__get__
_BASICSIZE = type.__dict__["__basicsize__"].__get__
_ITEMSIZE = type.__dict__["__itemsize__"].__get__
_DICTOFFSET = type.__dict__["__dictoffset__"].__get__
_CLASS_DICT = type.__dict__["__dict__"].__get__
_PROXY_ITEMS = type(_CLASS_DICT(type)).items
_GETSET, _MEMBER = types.GetSetDescriptorType, types.MemberDescriptorType
_GETSET_GET, _MEMBER_GET = _GETSET.__get__, _MEMBER.__get__
_DESCR_NAME = {_GETSET: _GETSET.__dict__["__name__"].__get__, _MEMBER: _MEMBER.__dict__["__name__"].__get__}
_DESCR_OWNER = {
    _GETSET: _GETSET.__dict__["__objclass__"].__get__,
    _MEMBER: _MEMBER.__dict__["__objclass__"].__get__,
}
_HEAPTYPE, _IMMUTABLETYPE = 1 << 9, 1 << 8  # a class statement makes a heap type that stays mutable
_PTR = tuple.__itemsize__
_REAL, _IMAG = complex.__dict__["real"].__get__, complex.__dict__["imag"].__get__
# C classes whose instances hold nothing but a base value read below and member descriptors
_KNOWN = {id(c) for c in (object, int, float, str, complex, bytes, bytearray, list, tuple, dict, set,
                          frozenset, collections.defaultdict, collections.OrderedDict)}  # fmt: skip
_SAFE_KEYS = {id(c) for c in (str, int, float, bytes, bool, type(None))}  # whose == and hash are C
_DATE, _DATETIME, _TIME = datetime.date, datetime.datetime, datetime.time
_TIMEDELTA, _TIMEZONE, _DECIMAL = datetime.timedelta, datetime.timezone, decimal.Decimal


def _text(s):
    """An exact str copy of a str (or str subclass) read from a class, cut to the bound."""
    return str.__str__(s)[:_MAX_STR] if issubclass(type(s), str) else "?"


def _own_items(c):
    """A class's own dict as (name, value) pairs, without lookups (a hostile key's ``__eq__``
    would run); None when a key is not an exact str."""
    items = list(_PROXY_ITEMS(_CLASS_DICT(c)))
    return items if all(type(k) is str for k, _ in items) else None


def _mro(cls):
    """The class's identity: module and qualified name of every class in its MRO."""
    try:
        return [_type_name(c) for c in _MRO(cls)]
    except Exception:
        return ["?"]


def _key(v):
    return json.dumps(v, sort_keys=True)


def _type_name(t):
    try:
        if _FLAGS(t) & _HEAPTYPE:  # its __module__ is in its dict: found by iterating, no lookup
            module = [x for k, x in _own_items(t) or () if k == "__module__" and type(x) is str]
            module = module[0] if module else "?"
        else:
            module = _MODULE(t)
        return _text(module) + "." + _text(_QUALNAME(t))
    except Exception:
        return "?"


def encode(v, depth=0, budget=None):
    """A JSON value standing for ``v``: builtin values by content, classes by name, anything else
    by its type's name and its state (see ``_object``). No method of the code under test runs:
    types are read with ``type()`` and checked exactly, values through the C slots and
    descriptors of the classes that define them. Depth and the number of values encoded (long
    strings count for more) are bounded: past them, the rest is cut, the same way for the gold
    record."""
    budget = budget if budget is not None else [_MAX_NODES, {}, {}]
    budget[0] -= 1
    t = type(v)
    if v is None or t is bool or t is int and -(2**53) < v < 2**53:
        return v
    if budget[0] < 0:
        return {"cut": True}
    if t is int:
        digits = format(v, "x")  # hex: no decimal conversion limit
        budget[0] -= min(len(digits), _MAX_STR) // 16  # long text costs in proportion
        if len(digits) > _MAX_STR:
            return {"int": digits[:_MAX_STR], "len": len(digits)}
        return {"int": "-0x" + digits[1:] if v < 0 else "0x" + digits}
    if t is float:
        return v if math.isfinite(v) else {"float": repr(v)}
    if t is str:
        budget[0] -= min(len(v), _MAX_STR) // 16
        return v if len(v) <= _MAX_STR else {"str": v[:_MAX_STR], "len": len(v)}
    if depth >= _MAX_DEPTH:
        return {"deep": _name(t, budget)}
    if t is bytes or t is bytearray:
        return _bytes(v[:_MAX_STR], len(v), budget)
    if t is complex:
        return {"complex": [encode(v.real), encode(v.imag)]}
    if issubclass(t, type):  # t's own MRO, read in C: no __class__, no __instancecheck__
        return {"class": _name(v, budget)}
    if t is _DATE or t is _DATETIME or t is _TIME or t is _TIMEDELTA or t is _TIMEZONE or t is _DECIMAL:
        return _value_type(t, v, depth, budget)
    # A value inside itself (a doubly linked list, a parent link) is marked by how far up it is:
    # encoded again it would take the whole budget (2 links a node: 2**depth paths).
    path = budget[2]
    if id(v) in path:
        return {"cycle": depth - path[id(v)]}
    path[id(v)] = depth
    try:
        if t is list or t is tuple or t is set or t is frozenset or t is dict:
            return _container(t, v, len(v), depth, budget)
        return _object(t, v, depth, budget)
    finally:
        del path[id(v)]


def _container(t, items, n, depth, budget):
    """A list, tuple, set, frozenset or dict (``items``: an exact one, or its items read in C
    from a subclass instance) of ``n`` items; the first ``_MAX_ITEMS`` are encoded."""
    if t is dict:
        pairs = [[_key(encode(k, depth + 1, budget)), encode(x, depth + 1, budget)]
                 for k, x in itertools.islice(dict.items(items), _MAX_ITEMS)]  # fmt: skip
        return {"dict": sorted(pairs, key=lambda p: p[0]), "len": n}
    if t is set or t is frozenset:
        keys = sorted(_key(encode(x, depth + 1, budget)) for x in itertools.islice(items, _MAX_ITEMS))
        return {_NAME(t): keys, "len": n}
    return {_NAME(t): [encode(x, depth + 1, budget) for x in itertools.islice(items, _MAX_ITEMS)], "len": n}


def _bytes(data, n, budget):
    """``data``: the first ``_MAX_STR`` bytes (an exact bytes or bytearray) of ``n``."""
    budget[0] -= len(data) // 8
    return {"bytes": bytes(data).hex(), "len": n}


# A subclass instance of a builtin value type: its base value, read through the base's own C code.
_BASES_READ = (
    (int, lambda v, d, b: encode(int.__int__(v), d, b)),
    (float, lambda v, d, b: encode(float.__float__(v), d, b)),
    (str, lambda v, d, b: encode(str.__str__(v), d, b)),
    (complex, lambda v, d, b: {"complex": [encode(_REAL(v)), encode(_IMAG(v))]}),
    (bytes, lambda v, d, b: _bytes(bytes.__getitem__(v, slice(0, _MAX_STR)), bytes.__len__(v), b)),
    (
        bytearray,
        lambda v, d, b: _bytes(bytearray.__getitem__(v, slice(0, _MAX_STR)), bytearray.__len__(v), b),
    ),
    (
        list,
        lambda v, d, b: _container(list, list.__getitem__(v, slice(0, _MAX_ITEMS)), list.__len__(v), d, b),
    ),
    (
        tuple,
        lambda v, d, b: _container(tuple, tuple.__getitem__(v, slice(0, _MAX_ITEMS)), tuple.__len__(v), d, b),
    ),
    (collections.OrderedDict, lambda v, d, b: _ordered(v, d, b)),
    (dict, lambda v, d, b: _container(dict, v, dict.__len__(v), d, b)),
    (set, lambda v, d, b: _container(set, set.__iter__(v), set.__len__(v), d, b)),
    (frozenset, lambda v, d, b: _container(frozenset, frozenset.__iter__(v), frozenset.__len__(v), d, b)),
)


def _ordered(v, depth, budget):
    """An OrderedDict's (key, value) pairs in its order (which its == compares), read in C. The
    C iteration looks keys up: only when every key's == is C code and there are few; else None."""
    n = dict.__len__(v)
    if n > _MAX_ITEMS or not all(id(type(k)) in _SAFE_KEYS for k in dict.keys(v)):
        return None
    return _container(list, [(k, x) for k, x in collections.OrderedDict.items(v)], n, depth, budget)


def _value_type(t, v, depth, budget):
    """The stdlib's C value types, exactly: their own C methods write their state as text. A
    tzinfo is encoded apart (its utcoffset never runs: it may be the code under test's)."""
    out = {"obj": _name(t, budget)}
    if t is _DATETIME or t is _TIME:
        out["state"] = t.isoformat(t.replace(v, tzinfo=None)) + (" fold=1" if v.fold else "")
        if v.tzinfo is not None:
            out["tzinfo"] = encode(v.tzinfo, depth + 1, budget)
    elif t is _TIMEZONE:  # its name may be a str subclass: encoded, never formatted
        out["state"] = _TIMEDELTA.__str__(_TIMEZONE.utcoffset(v, None)) + " " + _key(encode(
            _TIMEZONE.tzname(v, None), depth + 1, budget))  # fmt: skip
    else:
        out["state"] = t.isoformat(v) if t is _DATE else t.__str__(v)
    return out


def _cached(kind, t, budget, make):
    """``make(t)``, once per class and encode call (no code runs between, so no class changes);
    keyed by id, with the class kept alive (a dict keyed by the class would hash it)."""
    key = (kind, id(t))
    if key not in budget[1]:
        budget[1][key] = (t, make(t))
    return budget[1][key][1]


def _name(t, budget):
    name = _cached("name", t, budget, _type_name)
    budget[0] -= len(name) // 16  # as the str it is
    return name


def _layout(t):
    """How to read the state of ``t``'s instances: (the instance dict's C getset or None, slots as
    [(name, member descriptor)], slot names), or None when some of it is out of reach: an
    ancestor is a C class we do not know (its state is in C fields), or instances have a dict
    but no class holds the C getset for it (a class that hides ``__dict__``). Ancestors are the
    MRO and every base transitively (a metaclass's ``mro()`` may leave some out)."""
    ancestors = list(_MRO(t) or ())
    seen = {id(c) for c in ancestors}  # by id: ``in`` would run a metaclass's __eq__
    for c in ancestors:  # grows as it goes: bases not in the MRO are appended
        for b in _BASES(c):
            if id(b) not in seen:
                seen.add(id(b))
                ancestors.append(b)
    getset, slots, names = None, [], set()
    for i, c in enumerate(ancestors):
        items = _own_items(c)
        if items is None:
            return None
        members = [(k, d) for k, d in items if type(d) is _MEMBER and _owned(d, k, c)]
        if id(c) not in _KNOWN and not _adds_no_hidden_state(c, len(members)):
            return None
        for k, d in items:
            if getset is None and k == "__dict__" and type(d) is _GETSET and _owned(d, k, c):
                getset = d
        for k, d in members:  # a name two classes' slots share: both hold a value
            slots.append((k if k not in names else "!slot" + str(i) + " " + k, d))
            names.add(k)
    if _DICTOFFSET(t) != 0 and getset is None:
        return None
    return getset, slots, names


def _owned(d, name, c):
    """Whether a descriptor found under ``name`` in ``c``'s dict is ``c``'s own, for that name
    (not one copied there from another class, whose C getter could do anything)."""
    own_name = _DESCR_NAME[type(d)](d)
    return type(own_name) is str and own_name == name and _DESCR_OWNER[type(d)](d) is c


def _adds_no_hidden_state(c, slots):
    """Whether ``c`` adds no state that its slots, instance dict and weakref pointers do not hold:
    made by a class statement (or ``type()``: a mutable heap type) adding no more to its base's
    size, or a C class adding nothing at all (e.g. ``datetime.tzinfo``)."""
    flags, base = _FLAGS(c), _BASE(c)
    if base is None or _ITEMSIZE(c) != _ITEMSIZE(base):
        return False
    extra = _BASICSIZE(c) - _BASICSIZE(base)
    if not flags & _HEAPTYPE or flags & _IMMUTABLETYPE:
        return extra == 0 and _DICTOFFSET(c) == _DICTOFFSET(base)
    return 0 <= extra <= (slots + 2) * _PTR


def _attribute(k, slot_names, depth, budget):
    """An instance dict key as a state name: itself when it is a plain str; else after ``!``, so
    names never collide (``!`` + a key starting with ``!`` or naming a slot, ``!key `` + the
    JSON of any other key's encoding). Second: False, or True for any other key: the state is
    then marked as cut, as a name cannot carry the key's faithfulness."""
    if type(k) is str and len(k) <= _MAX_STR:
        budget[0] -= len(k) // 16
        return ("!" + k if k[:1] == "!" or k in slot_names else k), False
    return "!key " + _key(encode(k, depth + 1, budget)), True


def _object(t, v, depth, budget):
    """Any other object: ``{"obj": type name, "state": {name: encoded value}}``, the state being
    the instance dict (read through its class's C getset, iterated in C) and the slots that are
    set (through their member descriptors), sorted by name. With a builtin base (``class M(list)``)
    the base value too. Without ``"state"`` when it is out of reach (``_layout``, or reading it
    failed); with ``"len"`` (the number of entries) when entries were cut."""
    out = {"obj": _name(t, budget)}
    for base, read in _BASES_READ:
        if issubclass(t, base):  # t's own MRO, read in C: no __class__, no __instancecheck__
            out["base"] = read(v, depth + 1, budget)
            if out["base"] is None:  # out of reach: opaque
                return {"obj": out["obj"]}
            break
    try:
        layout = _cached("layout", t, budget, _layout)
        read = layout and _entries(t, v, layout, depth, budget)
    except Exception:  # e.g. the dict changed size: another thread of the code under test
        read = None
    if not read:
        return out
    entries, total, cut = read
    state = {}
    for name, x in sorted(entries, key=lambda e: e[0]):
        cut = cut or name in state  # two keys whose encodings are alike
        state[name] = encode(x, depth + 1, budget)
    out["state"] = state
    if cut or len(entries) < total:
        out["len"] = total
    return out


def _entries(t, v, layout, depth, budget):
    """(name, value) of the instance dict's items and the set slots, at most ``_MAX_ITEMS``; their
    total; whether a name was cut. None when the instance dict is not a dict."""
    getset, slots, slot_names = layout
    entries, total, cut = [], 0, False
    if getset is not None:
        d = _GETSET_GET(getset, v, t)
        if not issubclass(type(d), dict):  # C MRO (isinstance may read __class__)
            return None
        total = dict.__len__(d)
        for k, x in itertools.islice(dict.items(d), _MAX_ITEMS):
            name, clipped = _attribute(k, slot_names, depth, budget)
            entries.append((name, x))
            cut = cut or clipped
    for name, descr in slots:
        try:
            x = _MEMBER_GET(descr, v, t)
        except AttributeError:  # an unset slot
            continue
        total += 1
        if len(entries) < _MAX_ITEMS:
            entries.append((name, x))
    return entries, total, cut


def _test_id():
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def _recording(test):
    """Whether ``test`` may still add to the record (see ``_MAX_RECORD``); moves to a new test."""
    if _LEFT[1] != test:
        _LEFT[1], _LEFT[2] = test, _MAX_TEST
    return _LEFT[0] >= 0 and _LEFT[2] >= 0


def _emit(site, values):
    test = _test_id()
    line = (json.dumps({"t": test, "s": site, "v": values}) + "\n").encode()
    with _LOCK:
        if not _recording(test):
            return
        if len(line) > min(_LEFT[0], _LEFT[2]):
            full = len(line) > _LEFT[0]
            line = (json.dumps({"t": test, "s": site, "v": [OVERFLOW]}) + "\n").encode()
            _LEFT[0], _LEFT[2] = (-1 if full else _LEFT[0] - len(line)), -1
        else:
            _LEFT[0], _LEFT[2] = _LEFT[0] - len(line), _LEFT[2] - len(line)
        while line and _FD >= 0:
            line = line[os.write(_FD, line) :]


OVERFLOW = {"!overflow": True}


def _raised(e):
    return {"!raised": _mro(type(e))}


def probe(site, ops, *thunks):
    """Evaluates the operands in order and records them (the first exception ends the site, as it
    would end the assert); with comparison ``ops``, the comparison's truth is recorded too; with
    ``("bool",)``, only the one operand's truth."""
    values, out = [], []
    # What the assert raises is recorded, then raised on, as the original assert raises it (inside
    # ``pytest.raises`` that is what the test expects: ``assert coll == remap(coll)`` recursing).
    if ops == ("bool",):  # a bare ``assert X``: only its truth counts, as in the original test
        try:
            truth = bool(thunks[0]())
        except Exception as e:
            _emit(site, [_raised(e)])
            raise
        _emit(site, [{"!truth": truth}])
        return
    for thunk in thunks:
        try:
            values.append(thunk())
        except Exception as e:
            _emit(site, out + [_raised(e)])
            raise
        out.append(_safe_encode(values[-1]) if _recording(_test_id()) else None)  # past it: no work
    if ops:
        try:
            out.append({"!truth": _chain(ops, values)})
        except Exception as e:
            _emit(site, out + [_raised(e)])
            raise
    _emit(site, out)


def _chain(ops, values):
    """``a < b < c`` as Python evaluates it: pairwise, stopping at the first false link."""
    return all(COMPARISONS[op](a, b) for op, a, b in zip(ops, values, values[1:]))  # noqa: B905 (python3 < 3.10)


def _safe_encode(v):
    try:
        return encode(v)
    except Exception as e:
        return {"unencodable": _mro(type(e))}


class raises:
    """``with raises(site)``: records what the block raised (its MRO as ``module.qualname`` and its
    message) and swallows it,
    so the test goes on as it would after ``pytest.raises``."""

    def __init__(self, site):
        self.site, self.type, self.value, self.tb = site, None, None, None

    def __enter__(self):
        return self

    @property
    def typename(self):
        return self.type.__name__ if self.type else None

    def match(self, regexp):
        """As pytest's ExceptionInfo.match: the message must contain ``regexp``."""
        import re

        if self.value is None or not re.search(regexp, str(self.value)):
            raise AssertionError(f"exception message does not match {regexp!r}")
        return True

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            _emit(self.site, [{"!raised": None}])
            return False
        self.type, self.value, self.tb = exc_type, exc, tb
        try:  # the message, as pytest.raises's match reads it
            msg = str.__str__(str(exc))[:_MAX_STR]
        except Exception:
            msg = "?"
        _emit(self.site, [{"!raised": _mro(exc_type), "msg": msg}])
        # Swallowed whatever it is, as pytest.raises(E) swallows a BaseException E names (an
        # AbortThread, SystemExit): E stays on the host, which compares the recorded class.
        return True
