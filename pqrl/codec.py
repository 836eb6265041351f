"""Binary codec for Trajectory records: a msgpack header followed by raw numpy buffers.

Layout (version 3), little-endian; one blob holds one or several records (a finished group)::

    b"PQT" | version:u8 | header_len:u32 | header (msgpack) | zero pad to 8 bytes
    | tokens:i4[N] | behavior_logprobs:f4[N] | versions:i4[N] | generated:u1[N] | loss_mask:u1[N]

Each array is the concatenation of the records' arrays. The header is a map of columns: ``lens``
(tokens per record, summing to N) and, for every other field of Trajectory, the list of its values,
one per record. Columns keep the per-record Python small on both sides: the decoder checks a field's
types for all records at once and builds each record without a map of its own, and the token
invariants are checked once over the concatenation (Trajectory._from_columns). Decoded arrays are
zero-copy read-only views of the blob, so a group of 8 costs little more than one record
(bench/store.py); JSON lists cost ~20x more.

Values as stored: a turn is ``[start, end, finish_reason, [[name, arguments, status], ...]]``, a
truncation ``[kind, at_token, detail]`` or nil, and enums their string values.

The version byte selects the decoder, so blobs written by older releases stay readable: version 2
had the same arrays after a header of ``lens`` and ``records``, one map of the fields per record;
version 1 held exactly one record, its header that map plus ``T``, the token count. Add a decoder
beside these when the layout changes again.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import msgpack
import numpy as np

from pqrl.trajectory import ToolCall, Trajectory, TrajectoryError, Truncation, Turn, _new_turn

__all__ = ["CURRENT_VERSION", "CodecError", "decode", "decode_many", "encode", "encode_many", "encode_parts"]

MAGIC = b"PQT"
CURRENT_VERSION = 3
_PREFIX = struct.Struct("<3sBI")  # magic, version, header length
# The arrays in blob order; 4-byte ones first so they stay aligned after the padded header.
_ARRAYS = (
    ("tokens", np.dtype("<i4")),
    ("behavior_logprobs", np.dtype("<f4")),
    ("versions", np.dtype("<i4")),
    ("generated", np.dtype("u1")),
    ("loss_mask", np.dtype("u1")),
)
_BYTES_PER_TOKEN = sum(dt.itemsize for _, dt in _ARRAYS)
# Records hold native arrays: on a little-endian machine they are already in blob order.
_NATIVE_IS_BLOB_ORDER = sys.byteorder == "little"

# The header's fields besides the arrays, in Trajectory's order.
_FIELDS = (
    "id",
    "run_id",
    "task_id",
    "group_id",
    "env",
    "prompt_len",
    "turns",
    "reward",
    "reward_info",
    "status",
    "truncation",
    "timings",
)
# The msgpack types a field may decode to, where Trajectory does not check them itself: it does for
# the strings, prompt_len and status, and would take a reward of "1.5".
_KINDS: dict[str, set[type]] = {
    "turns": {list},
    "reward": {int, float},
    "reward_info": {dict},
    "truncation": {list, type(None)},
    "timings": {dict},
}
_ROW = attrgetter(*_FIELDS)  # one record's values; enums are written as their string values


class CodecError(ValueError):
    """A blob is not a valid encoded Trajectory; the message says what is wrong with it."""


def encode(t: Trajectory) -> bytes:
    """Encodes one (validated) Trajectory."""
    return encode_many([t])


def decode(blob: bytes | bytearray | memoryview) -> Trajectory:
    """Decodes a blob holding exactly one record (any released version)."""
    records = decode_many(blob)
    if len(records) != 1:
        raise CodecError(f"blob holds {len(records)} records, expected one: use decode_many")
    return records[0]


def encode_many(ts: Sequence[Trajectory]) -> bytes:
    """Encodes several (validated) Trajectories, e.g. one group, into one blob."""
    return b"".join(encode_parts(ts))


def encode_parts(ts: Sequence[Trajectory]) -> list[bytes | np.ndarray]:
    """``encode_many(ts)`` as the contiguous buffers it joins, in order: the prefix and header,
    then the records' arrays as they are, converted only where strided or not little-endian.

    A writer that takes several buffers (the store's XADD) sends these without first copying
    half a megabyte into one blob.
    """
    arrays = [getattr(t, name) for name, _ in _ARRAYS for t in ts]
    if not (_NATIVE_IS_BLOB_ORDER and all(a.flags.c_contiguous for a in arrays)):
        dtypes = [dtype for _, dtype in _ARRAYS for _ in ts]
        arrays = [np.ascontiguousarray(a, dtype) for a, dtype in zip(arrays, dtypes, strict=True)]
    return [_head(ts), *arrays]


def decode_many(blob: bytes | bytearray | memoryview) -> list[Trajectory]:
    """Decodes a blob written by any released codec version into its records.

    Raises:
        CodecError: the blob is truncated, corrupt, of an unknown version, or decodes to a record
            that fails Trajectory validation.
    """
    buf = memoryview(blob)
    if buf.nbytes < _PREFIX.size:
        raise CodecError(f"blob of {buf.nbytes} bytes is shorter than the {_PREFIX.size}-byte prefix")
    magic, version, header_len = _PREFIX.unpack_from(buf)
    if magic != MAGIC:
        raise CodecError(f"bad magic {bytes(magic)!r}: not a pqrl Trajectory blob")
    decoder = _DECODERS.get(version)
    if decoder is None:
        raise CodecError(f"unknown codec version {version} (this release reads {sorted(_DECODERS)})")
    start = _PREFIX.size
    if start + header_len > buf.nbytes:
        raise CodecError(f"header of {header_len} bytes runs past the {buf.nbytes}-byte blob")
    try:
        header = msgpack.unpackb(buf[start : start + header_len], raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError) as e:
        raise CodecError(f"corrupt msgpack header: {e}") from None
    if not isinstance(header, dict):
        raise CodecError(f"header is a {type(header).__name__}, not a map")
    lens, columns = decoder(header)
    body = start + header_len + (-(start + header_len) % 8)
    try:
        return Trajectory._from_columns(_arrays(buf, lens, body), lens, _parse_columns(columns))
    except TrajectoryError as e:
        raise CodecError(f"blob decodes to an invalid record: {e}") from e


# ---------------------------------------------------------------- header layouts, newest first


def _head(ts: Sequence[Trajectory]) -> bytes:
    """The blob up to its arrays: prefix, header and padding."""
    header = msgpack.packb(_columns(ts), use_bin_type=True)
    pad = -(_PREFIX.size + len(header)) % 8
    return b"".join([_PREFIX.pack(MAGIC, CURRENT_VERSION, len(header)), header, b"\0" * pad])


def _columns(ts: Sequence[Trajectory]) -> dict[str, list[Any]]:
    values = zip(*map(_ROW, ts), strict=True) if ts else [()] * len(_FIELDS)  # one tuple per field
    columns = dict(zip(_FIELDS, map(list, values), strict=True))
    columns["lens"] = [len(t.tokens) for t in ts]
    columns["prompt_len"] = [int(p) for p in columns["prompt_len"]]  # may be a numpy integer
    columns["turns"] = [[_turn_as_stored(u) for u in turns] for turns in columns["turns"]]
    if columns["truncation"].count(None) != len(ts):
        columns["truncation"] = [
            None if c is None else [c.kind, c.at_token, c.detail] for c in columns["truncation"]
        ]
    return columns


def _turn_as_stored(u: Turn) -> list[Any]:
    calls = [[c.name, c.arguments, c.status] for c in u.tool_calls] if u.tool_calls else []
    return [u.start, u.end, u.finish_reason, calls]


def _decode_v3(h: dict[str, Any]) -> tuple[list[int], dict[str, list[Any]]]:
    lens = _lens(_field(h, "lens", list))
    columns = {key: _field(h, key, list) for key in _FIELDS}
    for key, values in columns.items():
        if len(values) != len(lens):
            raise CodecError(
                f"header field {key!r} has {len(values)} values for the {len(lens)} records in lens"
            )
    return lens, columns


def _decode_v2(h: dict[str, Any]) -> tuple[list[int], dict[str, list[Any]]]:
    lens, records = _field(h, "lens", list), _field(h, "records", list)
    if len(lens) != len(records):
        raise CodecError(f"header lens {lens!r} do not match its {len(records)} records")
    return _lens(lens), _transpose(records)


def _decode_v1(h: dict[str, Any]) -> tuple[list[int], dict[str, list[Any]]]:
    return _lens([_field(h, "T", int)]), _transpose([h])


def _transpose(records: list[Any]) -> dict[str, list[Any]]:
    """Per-record maps as columns."""
    for r in records:
        if not isinstance(r, dict):
            raise CodecError(f"record header is a {type(r).__name__}, not a map")
    try:
        return {key: [r[key] for r in records] for key in _FIELDS}
    except KeyError as e:
        raise CodecError(f"header lacks field {e.args[0]!r}") from None


_DECODERS: dict[int, Callable[[dict[str, Any]], tuple[list[int], dict[str, list[Any]]]]] = {
    1: _decode_v1,
    2: _decode_v2,
    3: _decode_v3,
}

# ---------------------------------------------------------------- shared by every version


def _lens(lens: list[Any]) -> list[int]:
    if not (set(map(type, lens)) <= {int} and min(lens, default=0) >= 0):
        raise CodecError(f"header lens {lens!r} are not token counts")
    return lens


def _arrays(buf: memoryview, lens: list[int], off: int) -> dict[str, np.ndarray]:
    total = sum(lens)
    if off + total * _BYTES_PER_TOKEN != buf.nbytes:
        raise CodecError(
            f"blob is {buf.nbytes} bytes but {total} tokens need {off + total * _BYTES_PER_TOKEN}"
        )
    arrays = {}
    for name, dtype in _ARRAYS:
        arrays[name] = np.frombuffer(buf, dtype=dtype, count=total, offset=off)
        off += total * dtype.itemsize
    return arrays


def _parse_columns(columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Checks the types Trajectory leaves to the codec and builds the turns and truncations."""
    for key, kinds in _KINDS.items():
        if not set(map(type, columns[key])) <= kinds:
            bad = next(v for v in columns[key] if type(v) not in kinds)
            raise CodecError(f"header field {key!r} has type {type(bad).__name__}")
    return {**columns, "turns": _turns(columns["turns"]), "truncation": _truncations(columns["truncation"])}


def _turns(column: list[list[Any]]) -> list[tuple[Turn, ...]]:
    try:  # most turns call no tool: comparing with [] skips building their calls
        return [
            tuple(
                [_new_turn(s, e, fr, () if calls == [] else _tool_calls(calls)) for s, e, fr, calls in turns]
            )
            for turns in column
        ]
    except (TypeError, ValueError) as e:
        raise CodecError(f"malformed turns in header: {e}") from None


def _tool_calls(calls: list[Any]) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(*c) for c in calls)


def _truncations(column: list[list[Any] | None]) -> list[Truncation | None]:
    if column.count(None) == len(column):  # nothing truncated, as in most groups
        return column
    try:
        out = [None if raw is None else Truncation(*raw) for raw in column]
    except (TypeError, ValueError) as e:
        raise CodecError(f"malformed truncation in header: {e}") from None
    for t in out:  # compared with the token count later, where anything else would raise TypeError
        if t is not None and not isinstance(t.at_token, (int, float)):
            raise CodecError(f"malformed truncation in header: at_token {t.at_token!r} is not a number")
    return out


def _field(h: dict[str, Any], key: str, kind: type) -> Any:
    try:
        value = h[key]
    except KeyError:
        raise CodecError(f"header lacks field {key!r}") from None
    if type(value) is not kind:
        raise CodecError(f"header field {key!r} has type {type(value).__name__}")
    return value
