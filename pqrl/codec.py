"""Binary codec for Trajectory records: a msgpack header followed by raw numpy buffers.

Layout (version 2), little-endian; one blob holds one or several records (a finished group)::

    b"PQT" | version:u8 | header_len:u32 | header (msgpack) | zero pad to 8 bytes
    | tokens:i4[N] | behavior_logprobs:f4[N] | versions:i4[N] | generated:u1[N] | loss_mask:u1[N]

where the header holds ``lens`` (tokens per record, summing to N) and one map of scalar fields per
record, and each array is the concatenation of the records' arrays. Decoding makes zero-copy
read-only views and checks the token invariants once over the concatenation, so a group of 8
costs little more than one record (bench/store.py); JSON lists cost ~20x more.

The version byte selects the decoder, so blobs written by older releases stay readable: version 1
held exactly one record with ``T`` in its header. Add ``_decode_v3`` beside these when the layout
changes again.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import numpy as np

from pqrl.trajectory import ToolCall, Trajectory, TrajectoryError, Truncation, Turn, check_token_arrays

__all__ = ["CURRENT_VERSION", "CodecError", "decode", "decode_many", "encode", "encode_many"]

MAGIC = b"PQT"
CURRENT_VERSION = 2
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
    header = msgpack.packb(
        {"lens": [t.num_tokens for t in ts], "records": [_record_header(t) for t in ts]}, use_bin_type=True
    )
    pad = -(_PREFIX.size + len(header)) % 8
    parts: list[Any] = [_PREFIX.pack(MAGIC, CURRENT_VERSION, len(header)), header, b"\0" * pad]
    for name, dtype in _ARRAYS:  # join reads the arrays' buffers directly: one copy, no wrappers
        parts += [np.ascontiguousarray(getattr(t, name), dtype=dtype) for t in ts]
    return b"".join(parts)


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
    body = start + header_len + (-(start + header_len) % 8)
    try:
        return decoder(buf, header, body)
    except TrajectoryError as e:
        raise CodecError(f"blob decodes to an invalid record: {e}") from e


def _decode_v1(buf: memoryview, h: dict[str, Any], body: int) -> list[Trajectory]:
    n = _field(h, "T", int)
    return _records(buf, [n], [h], body)


def _decode_v2(buf: memoryview, h: dict[str, Any], body: int) -> list[Trajectory]:
    lens, headers = _field(h, "lens", list), _field(h, "records", list)
    if len(lens) != len(headers) or not all(isinstance(n, int) and n >= 0 for n in lens):
        raise CodecError(f"header lens {lens!r} do not match its {len(headers)} records")
    return _records(buf, lens, headers, body)


def _records(buf: memoryview, lens: list[int], headers: list[Any], off: int) -> list[Trajectory]:
    total = sum(lens)
    if total < 0 or off + total * _BYTES_PER_TOKEN != buf.nbytes:
        raise CodecError(
            f"blob is {buf.nbytes} bytes but {total} tokens need {off + max(total, 0) * _BYTES_PER_TOKEN}"
        )
    arrays = {}
    for name, dtype in _ARRAYS:
        arrays[name] = np.frombuffer(buf, dtype=dtype, count=total, offset=off)
        off += total * dtype.itemsize
    check_token_arrays(**arrays)  # once over the concatenation
    out, at = [], 0
    for n, h in zip(lens, headers, strict=True):
        if not isinstance(h, dict):
            raise CodecError(f"record header is a {type(h).__name__}, not a map")
        out.append(_record_from_header(h, {k: v[at : at + n] for k, v in arrays.items()}))
        at += n
    return out


def _record_header(t: Trajectory) -> dict[str, Any]:
    return {
        "id": t.id,
        "run_id": t.run_id,
        "task_id": t.task_id,
        "group_id": t.group_id,
        "env": t.env,
        "prompt_len": int(t.prompt_len),
        "turns": [
            [u.start, u.end, u.finish_reason, [[c.name, c.arguments, c.status.value] for c in u.tool_calls]]
            for u in t.turns
        ],
        "reward": t.reward,
        "reward_info": t.reward_info,
        "status": t.status.value,
        "truncation": None
        if t.truncation is None
        else [t.truncation.kind.value, t.truncation.at_token, t.truncation.detail],
        "timings": t.timings,
    }


def _record_from_header(h: dict[str, Any], arrays: dict[str, np.ndarray]) -> Trajectory:
    return Trajectory._from_checked_arrays(
        id=_field(h, "id", str),
        run_id=_field(h, "run_id", str),
        task_id=_field(h, "task_id", str),
        group_id=_field(h, "group_id", str),
        env=_field(h, "env", str),
        prompt_len=_field(h, "prompt_len", int),
        turns=_turns(_field(h, "turns", list)),
        reward=_field(h, "reward", (int, float)),
        reward_info=_field(h, "reward_info", dict),
        status=_field(h, "status", str),
        truncation=_truncation(_field(h, "truncation", (list, type(None)))),
        timings=_field(h, "timings", dict),
        **arrays,
    )


def _turns(raw: list[Any]) -> tuple[Turn, ...]:
    try:
        return tuple(Turn(s, e, fr, _tool_calls(calls)) for s, e, fr, calls in raw)
    except (TypeError, ValueError) as e:
        raise CodecError(f"malformed turns in header: {e}") from None


def _tool_calls(calls: list[Any]) -> tuple[ToolCall, ...]:
    if calls == []:  # most turns: skips building a generator for nothing
        return ()
    return tuple(ToolCall(*c) for c in calls)


def _truncation(raw: list[Any] | None) -> Truncation | None:
    try:
        return None if raw is None else Truncation(*raw)
    except (TypeError, ValueError) as e:
        raise CodecError(f"malformed truncation in header: {e}") from None


def _field(h: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    try:
        value = h[key]
    except KeyError:
        raise CodecError(f"header lacks field {key!r}") from None
    if not isinstance(value, kind) or (kind is int and type(value) is bool):
        raise CodecError(f"header field {key!r} has type {type(value).__name__}")
    return value


_DECODERS: dict[int, Callable[[memoryview, dict[str, Any], int], list[Trajectory]]] = {
    1: _decode_v1,
    2: _decode_v2,
}
