"""The probe record on the host: parsed and decoded totally, whatever the container wrote.

The record comes out of the grading container, where the code under test ran and could write
into the probe pipe. So nothing here may raise on what it reads (a crash would make the episode
``failed_infra``, dropped from training instead of scored 0): a line that is not a well-formed
entry makes the record malformed (``BadRecord``, a ``ValueError``), and a value that does not
decode makes that check fail. Nesting, int digits and string lengths are bounded before any work
is done on them; sets decode to sets of hashable values, frozensets to frozensets.

Objects (``{"obj": name, "state": ..., "base": ..., "tzinfo": ..., "len": ...}``) and classes
(``{"class": name}``) decode to ``Opaque``: no Python ``==`` of theirs is evaluated here. Their
shape is checked all the same (a malformed one is a BadRecord), and ``faithful`` says whether a
recorded value stands for the whole value, so that comparing encodings compares contents.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from typing import Any

from pqrl.text import encodable

__all__ = [
    "MAX_DEPTH",
    "BadRecord",
    "Opaque",
    "Record",
    "decode",
    "faithful",
    "parse_record",
    "sendable",
    "text",
]

# JSON nesting of one recorded value. The recorder's values are at most 20 containers deep (two
# JSON levels each, plus the set keys' own JSON): well below.
MAX_DEPTH = 64
MAX_INT_DIGITS = 4300  # CPython's own limit on int <-> decimal str conversions
MAX_TEXT = 10_000  # the recorder's cut for strings, bytes and big ints
_DECIMAL = re.compile(rf"-?[0-9]{{1,{MAX_INT_DIGITS}}}")
_HEX = re.compile(rf"-?0x[0-9a-f]{{1,{MAX_TEXT}}}")
_DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError, MemoryError)


class BadRecord(ValueError):
    """A probe record or value the recorder cannot have written; the message names no content."""


def text(value: object, limit: int = 2000) -> str:
    """``value`` (from the sandbox) as a str that serialises as UTF-8 (lone surrogates, e.g. from
    a file name that is not UTF-8, become backslash escapes) and is at most about ``limit`` long."""
    s = value if type(value) is str else repr(value) if isinstance(value, (int, float, bool)) else "?"
    if len(s) > limit:
        s = s[:limit] + f"... ({len(s) - limit} more characters)"
    return encodable(s)


def sendable(info: Any, limit: int = 4000, depth: int = 0) -> Any:
    """``info`` (a grading's info: JSON-like, built by the host, holding strings from the sandbox)
    with every string made ``text``, so the reply that carries it always serialises."""
    if isinstance(info, str):
        return text(info, limit)
    if depth > 20:
        return "?"
    if isinstance(info, dict):
        return {sendable(k, limit, depth + 1): sendable(v, limit, depth + 1) for k, v in info.items()}
    if isinstance(info, (list, tuple)):
        return [sendable(v, limit, depth + 1) for v in info]
    return info


def _depth_ok(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON) nests at most ``limit`` deep; iterative, so any depth is safe."""
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            if d >= limit:
                return False
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return True


Record = dict[str, list[tuple[int, list[Any]]]]  # test id -> its (site, recorded values) entries, in order


def parse_record(data: bytes, limit: int = 1 << 20) -> Record:
    """The runner's probe pipe -> test node id -> [(site, values)] in order. Raises BadRecord
    (a ValueError) when it is malformed: the code under test may have written into it, and then
    nothing of it counts."""
    record: dict[str, list[tuple[int, list[Any]]]] = defaultdict(list)
    for n, line in enumerate(data.splitlines()):
        if n >= limit:
            raise BadRecord(f"more than {limit} probe entries")
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError, MemoryError):  # bad JSON, bad UTF-8, too deep, huge ints
            raise BadRecord(f"probe entry {n} is not JSON the recorder writes") from None
        if not (
            type(entry) is dict
            and type(entry.get("s")) is int
            and type(entry.get("v")) is list
            and type(entry.get("t", "")) is str
            and _depth_ok(entry["v"])
        ):
            raise BadRecord(f"probe entry {n} is not {{t, s, v}} within the recorder's bounds")
        record[entry.get("t", "")].append((entry["s"], entry["v"]))
    return dict(record)


class Opaque:
    """A recorded value that is not a builtin one: equal to nothing on the host."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__


def decode(v: Any) -> Any:
    """The inverse of probe_runtime.encode for builtin values; anything else is ``Opaque``.
    Raises BadRecord (only) for a value the recorder cannot have written."""
    try:
        return _decode(v, 0)
    except BadRecord:
        raise
    except _DECODE_ERRORS:
        raise BadRecord("a recorded value does not decode") from None


def _int(s: Any) -> int:
    if type(s) is str and _DECIMAL.fullmatch(s):
        return int(s)
    if type(s) is str and _HEX.fullmatch(s):
        return int(s, 16)
    raise BadRecord("a recorded int is not a bounded decimal or hex numeral")


def _hashable(v: Any) -> Any:
    try:
        hash(v)
    except TypeError:  # e.g. a forged set inside a set
        return Opaque()
    return v


def _items(v: dict[str, Any], tag: str) -> list[Any]:
    items = v[tag]
    if type(items) is not list:
        raise BadRecord(f"a recorded {tag} is not a list")
    return items


def _decode(v: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise BadRecord("a recorded value nests too deep")
    if v is None or type(v) in (bool, int, float, str):
        return v
    if type(v) is not dict:
        raise BadRecord("a recorded value is not a builtin JSON value or a tagged object")
    d = depth + 1
    if "int" in v:
        return Opaque() if "len" in v else _int(v["int"])  # with "len": cut by the recorder
    if "float" in v:
        if type(v["float"]) is not str or len(v["float"]) > 64:
            raise BadRecord("a recorded float is not a short numeral")
        return float(v["float"])
    for tag, kind in (("list", list), ("tuple", tuple)):
        if tag in v:
            return kind(_decode(x, d) for x in _items(v, tag))
    for tag, kind in (("set", set), ("frozenset", frozenset)):
        if tag in v:
            keys = _items(v, tag)
            if not all(type(k) is str for k in keys):
                raise BadRecord(f"a recorded {tag} holds a key that is not JSON text")
            return kind(_hashable(_decode(json.loads(k), d)) for k in keys)
    if "dict" in v:
        pairs = _items(v, "dict")
        if not all(type(p) is list and len(p) == 2 and type(p[0]) is str for p in pairs):
            raise BadRecord("a recorded dict holds an item that is not [key, value]")
        return {_hashable(_decode(json.loads(k), d)): _decode(x, d) for k, x in pairs}
    if "bytes" in v:
        if type(v["bytes"]) is not str or len(v["bytes"]) > 2 * MAX_TEXT:
            raise BadRecord("recorded bytes are not bounded hex")
        return bytes.fromhex(v["bytes"])
    if "complex" in v:
        parts = _items(v, "complex")
        if len(parts) != 2:
            raise BadRecord("a recorded complex has not two parts")
        real, imag = (_decode(p, d) for p in parts)
        if not all(type(p) in (int, float) for p in (real, imag)):
            raise BadRecord("a recorded complex has a part that is not a number")
        return complex(real, imag)
    if "str" in v:
        if type(v["str"]) is not str:
            raise BadRecord("a recorded str is not a string")
        return v["str"]  # cut at the recorder's limit: compares unequal to the full string
    if "obj" in v:
        _check_object(v, d)
    elif "class" in v and (type(v["class"]) is not str or len(v) != 1 or len(v["class"]) > _MAX_NAME):
        raise BadRecord("a recorded class is not a bounded name")
    return Opaque()  # an object, or a marker (cut, too deep, unencodable): equal to nothing here


_MAX_NAME = 2 * MAX_TEXT + 1  # module and qualified name, each cut by the recorder
_OBJECT_KEYS = {"obj", "base", "state", "tzinfo", "len"}


def _check_object(v: dict[str, Any], depth: int) -> None:
    """Raises BadRecord unless ``v`` is an object as the recorder writes it: a type name, maybe
    a base value, a tzinfo and a count, and a state that is text or a map of names to values."""
    name, state = v["obj"], v.get("state", "")
    if not (v.keys() <= _OBJECT_KEYS and type(name) is str and len(name) <= _MAX_NAME):
        raise BadRecord("a recorded object is not {obj, base, state, tzinfo, len} with a bounded name")
    if "len" in v and not (type(v["len"]) is int and v["len"] >= 0):
        raise BadRecord("a recorded object's count is not a count")
    for key in ("base", "tzinfo"):
        if key in v:
            _decode(v[key], depth)
    if type(state) is str:
        if len(state) > MAX_TEXT:
            raise BadRecord("a recorded object's state text is not bounded")
        return
    if type(state) is not dict:
        raise BadRecord("a recorded object's state is neither text nor a map")
    for x in state.values():
        _decode(x, depth + 1)


def faithful(encoded: Any) -> bool:
    """Whether one recorded value (as probe_runtime.encode writes it) stands for all of the value
    it was encoded from: well-formed, and nothing in it cut (a long string or int, a container
    past its item bound, a ``cut`` or ``deep`` marker, an object's state with ``len``) or opaque
    (an object without ``state``, an ``unencodable`` one). Comparing two faithful encodings
    compares the values' contents. Total: False for anything malformed, never raises."""
    try:
        decode(encoded)
        return _faithful(encoded)
    except (BadRecord, *_DECODE_ERRORS):
        return False


def _faithful(v: Any) -> bool:
    """``v``: a value ``decode`` accepts (so bounded in depth), read in decode's tag order."""
    if type(v) is float:
        return math.isfinite(v)  # the recorder tags the others: a raw one is forged
    if type(v) is not dict:
        return True
    if "int" in v:
        return "len" not in v
    if "float" in v:
        return True
    for tag in _CONTAINERS:
        if tag in v:
            items = v[tag]
            return _counted(v, len(items)) and all(_faithful(x) for x in _inner(tag, items))
    if "bytes" in v:
        return _counted(v, len(bytes.fromhex(v["bytes"])))
    if "complex" in v:
        return True
    if "str" in v:
        return False
    if "obj" in v:
        state = v.get("state")
        parts = [v[k] for k in ("base", "tzinfo") if k in v] + (
            list(state.values()) if type(state) is dict else []
        )
        return "len" not in v and type(state) in (str, dict) and all(_faithful(x) for x in parts)
    return "class" in v


_CONTAINERS = ("list", "tuple", "set", "frozenset", "dict")


def _inner(tag: str, items: list[Any]) -> list[Any]:
    if tag in ("list", "tuple"):
        return items
    if tag == "dict":
        return [y for k, x in items for y in (json.loads(k), x)]
    return [json.loads(k) for k in items]


def _counted(v: dict[str, Any], n: int) -> bool:
    return type(v.get("len")) is int and v["len"] == n


def opaque_inside(v: Any) -> bool:
    """Whether a decoded value holds an ``Opaque`` anywhere (decoded values nest boundedly)."""
    if isinstance(v, Opaque):
        return True
    if isinstance(v, (list, tuple, set, frozenset)):
        return any(opaque_inside(x) for x in v)
    if isinstance(v, dict):
        return any(opaque_inside(k) or opaque_inside(x) for k, x in v.items())
    return False
