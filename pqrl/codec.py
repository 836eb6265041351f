"""Binary codec for Trajectory records: a msgpack header followed by raw numpy buffers.

Layout (version 1), little-endian::

    b"PQT" | version:u8 | header_len:u32 | header (msgpack) | zero pad to 8 bytes
    | tokens:i4[T] | behavior_logprobs:f4[T] | versions:i4[T] | generated:u1[T] | loss_mask:u1[T]

The arrays are decoded as zero-copy read-only views of the blob. JSON lists cost ~40x more to
encode and decode (bench/store.py). The version byte selects the decoder, so a blob written by an
older release stays readable after the layout changes: add ``_decode_v2`` beside ``_decode_v1``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from pqrl.trajectory import ToolCall, Trajectory, TrajectoryError, Truncation, Turn

__all__ = ["CURRENT_VERSION", "CodecError", "decode", "encode"]

MAGIC = b"PQT"
CURRENT_VERSION = 1
_PREFIX = struct.Struct("<3sBI")  # magic, version, header length
_I4, _F4, _U1 = np.dtype("<i4"), np.dtype("<f4"), np.dtype("u1")
_BYTES_PER_TOKEN = 4 + 4 + 4 + 1 + 1


class CodecError(ValueError):
    """A blob is not a valid encoded Trajectory; the message says what is wrong with it."""


def encode(t: Trajectory) -> bytes:
    """Encodes a (validated) Trajectory into one blob."""
    header = msgpack.packb(
        {
            "T": t.num_tokens,
            "id": t.id,
            "run_id": t.run_id,
            "task_id": t.task_id,
            "group_id": t.group_id,
            "env": t.env,
            "prompt_len": int(t.prompt_len),
            "turns": [
                [u.start, u.end, u.finish_reason, [[c.name, c.arguments, c.status] for c in u.tool_calls]]
                for u in t.turns
            ],
            "reward": t.reward,
            "reward_info": t.reward_info,
            "status": t.status.value,
            "truncation": None
            if t.truncation is None
            else [t.truncation.kind, t.truncation.at_token, t.truncation.detail],
            "timings": t.timings,
        },
        use_bin_type=True,
    )
    pad = -(_PREFIX.size + len(header)) % 8
    return b"".join(
        (
            _PREFIX.pack(MAGIC, CURRENT_VERSION, len(header)),
            header,
            b"\0" * pad,
            memoryview(np.ascontiguousarray(t.tokens, dtype=_I4)),
            memoryview(np.ascontiguousarray(t.behavior_logprobs, dtype=_F4)),
            memoryview(np.ascontiguousarray(t.versions, dtype=_I4)),
            memoryview(np.ascontiguousarray(t.generated, dtype=_U1)),
            memoryview(np.ascontiguousarray(t.loss_mask, dtype=_U1)),
        )
    )


def decode(blob: bytes | bytearray | memoryview) -> Trajectory:
    """Decodes a blob written by any released codec version.

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
    try:
        return decoder(buf, header_len)
    except TrajectoryError as e:
        raise CodecError(f"blob decodes to an invalid record: {e}") from e


def _decode_v1(buf: memoryview, header_len: int) -> Trajectory:
    start = _PREFIX.size
    if start + header_len > buf.nbytes:
        raise CodecError(f"header of {header_len} bytes runs past the {buf.nbytes}-byte blob")
    try:
        h = msgpack.unpackb(buf[start : start + header_len], raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError) as e:
        raise CodecError(f"corrupt msgpack header: {e}") from None
    if not isinstance(h, dict):
        raise CodecError(f"header is a {type(h).__name__}, not a map")
    n = _field(h, "T", int)
    off = start + header_len + (-(start + header_len) % 8)
    if n < 0 or off + n * _BYTES_PER_TOKEN != buf.nbytes:
        raise CodecError(
            f"blob is {buf.nbytes} bytes but a {n}-token record needs {off + max(n, 0) * _BYTES_PER_TOKEN}"
        )
    arrays = {}
    for name, dtype in (
        ("tokens", _I4),
        ("behavior_logprobs", _F4),
        ("versions", _I4),
        ("generated", _U1),
        ("loss_mask", _U1),
    ):
        arrays[name] = np.frombuffer(buf, dtype=dtype, count=n, offset=off)
        off += n * dtype.itemsize
    try:
        turns = tuple(
            Turn(start=s, end=e, finish_reason=fr, tool_calls=tuple(ToolCall(*c) for c in calls))
            for s, e, fr, calls in _field(h, "turns", list)
        )
        trunc = _field(h, "truncation", (list, type(None)))
        truncation = None if trunc is None else Truncation(*trunc)
    except (TypeError, ValueError) as e:
        raise CodecError(f"malformed turns/truncation in header: {e}") from None
    return Trajectory(
        id=_field(h, "id", str),
        run_id=_field(h, "run_id", str),
        task_id=_field(h, "task_id", str),
        group_id=_field(h, "group_id", str),
        env=_field(h, "env", str),
        prompt_len=_field(h, "prompt_len", int),
        turns=turns,
        reward=_field(h, "reward", (int, float)),
        reward_info=_field(h, "reward_info", dict),
        status=_field(h, "status", str),
        truncation=truncation,
        timings=_field(h, "timings", dict),
        **arrays,
    )


def _field(h: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in h:
        raise CodecError(f"header lacks field {key!r}")
    value = h[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CodecError(f"header field {key!r} has type {type(value).__name__}")
    return value


_DECODERS: dict[int, Callable[[memoryview, int], Trajectory]] = {1: _decode_v1}
