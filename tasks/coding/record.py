"""The probe record on the host: parsed and decoded totally, whatever the container wrote.

The record comes out of the grading container, where the code under test ran and could write
into the probe pipe. So nothing here may raise on what it reads (a crash would make the episode
``failed_infra``, dropped from training instead of scored 0): a line that is not a well-formed
entry makes the record malformed (``BadRecord``, a ``ValueError``), and a value that does not
decode makes that check fail. Nesting, int digits and string lengths are bounded before any work
is done on them; sets decode to sets of hashable values, frozensets to frozensets.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

from pqrl.text import encodable

__all__ = ["MAX_DEPTH", "BadRecord", "Opaque", "decode", "parse_record", "sendable", "text"]

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


def parse_record(data: bytes, limit: int = 1 << 20) -> dict[str, list[tuple[int, list[Any]]]]:
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
    return Opaque()


def opaque_inside(v: Any) -> bool:
    """Whether a decoded value holds an ``Opaque`` anywhere (decoded values nest boundedly)."""
    if isinstance(v, Opaque):
        return True
    if isinstance(v, (list, tuple, set, frozenset)):
        return any(opaque_inside(x) for x in v)
    if isinstance(v, dict):
        return any(opaque_inside(k) or opaque_inside(x) for k, x in v.items())
    return False
