"""The recorder the rewritten hidden tests call inside the grading container (standard library
only; uploaded as ``pqrl_probe_runtime``). tasks/coding/probes.py explains the scheme.

Each rewritten assert calls ``probe(site, ops, *thunks)``; each ``pytest.raises`` block is
``with raises(site)``. One JSON line per call goes to the descriptor in ``PQRL_PROBE_FD`` (a pipe
the runner reads): ``{"t": test id, "s": site, "v": [encoded values]}``. Nothing is compared here:
the expected values are on the host. The code under test can write into this pipe too; that gains
it nothing unless it knows the values the correct code computes.
"""

import json
import math
import os

_FD = int(os.environ.get("PQRL_PROBE_FD", "-1"))
_MAX_ITEMS = 1000  # per container: longer ones are cut (and marked), the gold record is cut alike
_MAX_STR = 10000
_MAX_DEPTH = 20
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
_NAME = type.__dict__["__name__"].__get__  # read a class's own fields, never a metaclass property
_QUALNAME = type.__dict__["__qualname__"].__get__
_MODULE = type.__dict__["__module__"].__get__
_MRO = type.__dict__["__mro__"].__get__


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
        module = _MODULE(t)
        return f"{module if type(module) is str else '?'}.{_QUALNAME(t)}"
    except Exception:
        return "?"


def encode(v, depth=0, budget=None):
    """A JSON value standing for ``v``. Builtin values by content; anything else by its type's
    name (with the value of an int/float/str base). No method of the code under test runs: types
    are read with ``type()`` and checked exactly, and a subclass's base value is taken through the
    base's own C slot. Depth and the number of values encoded (long strings count for more) are
    bounded: past them, the rest is cut, the same way for the gold record."""
    budget = budget if budget is not None else [_MAX_NODES]
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
        return {"deep": _type_name(t)}
    if t is list or t is tuple:
        items = [encode(x, depth + 1, budget) for x in v[:_MAX_ITEMS]]
        return {_NAME(t): items, "len": len(v)}
    if t is set or t is frozenset:
        keys = sorted(_key(encode(x, depth + 1, budget)) for x in list(v)[:_MAX_ITEMS])
        return {_NAME(t): keys, "len": len(v)}
    if t is dict:
        pairs = [[_key(encode(k, depth + 1, budget)), encode(x, depth + 1, budget)]
                 for k, x in list(v.items())[:_MAX_ITEMS]]  # fmt: skip
        return {"dict": sorted(pairs, key=lambda p: p[0]), "len": len(v)}
    if t is bytes or t is bytearray:
        budget[0] -= min(len(v), _MAX_STR) // 8
        return {"bytes": bytes(v[:_MAX_STR]).hex(), "len": len(v)}
    if t is complex:
        return {"complex": [encode(v.real), encode(v.imag)]}
    out = {"obj": _type_name(t)}
    for base, value in ((int, int.__int__), (float, float.__float__), (str, str.__str__)):
        if issubclass(t, base):  # t's own MRO, read in C: no __class__, no __instancecheck__
            out["base"] = encode(value(v), depth + 1, budget)
            break
    return out


def _test_id():
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def _emit(site, values):
    line = (json.dumps({"t": _test_id(), "s": site, "v": values}) + "\n").encode()
    while line and _FD >= 0:
        line = line[os.write(_FD, line) :]


def _raised(e):
    return {"!raised": _mro(type(e))}


def probe(site, ops, *thunks):
    """Evaluates the operands in order and records them (the first exception ends the site, as it
    would end the assert); with comparison ``ops``, the comparison's truth is recorded too; with
    ``("bool",)``, only the one operand's truth."""
    values, out = [], []
    if ops == ("bool",):  # a bare ``assert X``: only its truth counts, as in the original test
        try:
            _emit(site, [{"!truth": bool(thunks[0]())}])
        except Exception as e:
            _emit(site, [_raised(e)])
        return
    for thunk in thunks:
        try:
            values.append(thunk())
        except Exception as e:
            _emit(site, out + [_raised(e)])
            return
        out.append(_safe_encode(values[-1]))
    if ops:
        try:
            out.append({"!truth": _chain(ops, values)})
        except Exception as e:
            out.append(_raised(e))
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
        return issubclass(exc_type, Exception)  # KeyboardInterrupt and exits still end the test
