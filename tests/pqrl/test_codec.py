"""The binary codec: exact round trips, old blobs stay readable, corrupt blobs give clear errors."""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pqrl.codec import CURRENT_VERSION, MAGIC, CodecError, decode, decode_many, encode, encode_many
from pqrl.trajectory import ToolCall, ToolStatus, Trajectory, TruncationKind, Turn
from tests.conftest import make_trajectory

GOLDEN_V1 = Path(__file__).parent / "data" / "trajectory_v1.bin"


def test_round_trip_is_exact():
    t = make_trajectory(index=1)
    blob = encode(t)
    assert blob[:3] == MAGIC and blob[3] == CURRENT_VERSION
    back = decode(blob)
    assert back == t
    assert back.turns[0].tool_calls == (ToolCall("calculator", {"expr": "0+1"}, ToolStatus.OK),)
    assert type(back.turns[0].tool_calls[0].status) is ToolStatus
    assert type(back.truncation.kind) is TruncationKind
    assert back.truncation == t.truncation and back.reward_info == {"exact": True, "f1": 0.5}
    # arrays are zero-copy read-only views of the blob
    assert not back.tokens.flags.writeable


def test_blob_costs_14_bytes_per_token_plus_a_small_header():
    t = make_trajectory(prompt_len=200, turn_lens=((3000, 800), (96, 0)))
    blob = encode(t)
    header, body = _header_and_body(blob)
    assert len(body) == 14 * t.num_tokens
    assert len(blob) - len(body) < 512


def test_golden_v1_blob_still_decodes():
    # A version 1 blob (one record; statuses and kinds as plain strings): a layout change must keep
    # it readable.
    t = decode(GOLDEN_V1.read_bytes())
    expected = make_trajectory(index=1, seed=42, reward=0.5)
    assert t == expected
    assert t.id == "g0-1" and t.reward == 0.5 and t.truncation.kind is TruncationKind.CUT_TOOL_OUTPUT


@settings(max_examples=60, deadline=None)
@given(
    prompt_len=st.integers(0, 20),
    turns=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=4),
    reward=st.floats(-10, 10, allow_nan=False),
    info=st.dictionaries(
        st.text(max_size=8), st.one_of(st.integers(-5, 5), st.text(max_size=8), st.booleans())
    ),
    seed=st.integers(0, 2**16),
)
def test_round_trip_property(prompt_len, turns, reward, info, seed):
    t = make_trajectory(prompt_len=prompt_len, turn_lens=tuple(turns), reward=reward, seed=seed)
    t = Trajectory(**{**{f: getattr(t, f) for f in t.__dataclass_fields__}, "reward_info": info})
    assert decode(encode(t)) == t


def _header_and_body(blob: bytes) -> tuple[dict, bytes]:
    (hlen,) = struct.unpack_from("<I", blob, 4)
    header = msgpack.unpackb(blob[8 : 8 + hlen])
    body = blob[8 + hlen + (-(8 + hlen) % 8) :]
    return header, body


def _rebuild(header: dict, body: bytes, version: int = CURRENT_VERSION) -> bytes:
    h = msgpack.packb(header, use_bin_type=True)
    return struct.pack("<3sBI", MAGIC, version, len(h)) + h + b"\0" * (-(8 + len(h)) % 8) + body


def _corrupt_cases():
    blob = encode(make_trajectory())
    header, body = _header_and_body(blob)
    (T,) = header["lens"]
    (record,) = header["records"]
    gen_off = 12 * T  # generated array starts after tokens, logprobs, versions
    bad_mask = bytearray(body)
    bad_mask[gen_off] = 7

    def with_record(**changes):
        return _rebuild({**header, "records": [{**record, **changes}]}, body)

    def with_value(fmt, offset, value):  # one array element overwritten; token 0 is a prompt token
        changed = bytearray(body)
        struct.pack_into(fmt, changed, offset, value)
        return _rebuild(header, bytes(changed))

    first_turn = record["turns"][0]

    without_run_id = {k: v for k, v in record.items() if k != "run_id"}
    return [
        ("empty", b"", "shorter than"),
        ("bad magic", b"XYZ" + blob[3:], "bad magic"),
        ("unknown version", blob[:3] + bytes([99]) + blob[4:], "unknown codec version 99"),
        ("truncated body", blob[:-5], "tokens need"),
        ("extra bytes", blob + b"\0\0\0\0", "tokens need"),
        ("header past end", blob[:4] + struct.pack("<I", 10**6) + blob[8:], "runs past"),
        ("garbage header", blob[:8] + b"\xc1" * 40 + blob[48:], "corrupt msgpack header"),
        ("header not a map", _rebuild([1, 2], body), "not a map"),
        ("missing field", _rebuild({**header, "records": [without_run_id]}, body), "'run_id'"),
        ("wrong field type", with_record(prompt_len="5"), "'prompt_len'"),
        ("bad turns", with_record(turns=[[1]]), "turns"),
        ("lens mismatch", _rebuild({**header, "lens": [T, 3]}, body), "do not match"),
        ("record not a map", _rebuild({**header, "records": [[1, 2]]}, body), "not a map"),
        ("missing lens", _rebuild({"records": [record]}, body), "'lens'"),
        ("invalid record", _rebuild(header, bytes(bad_mask)), "Trajectory.generated"),
        ("negative token", with_value("<i", 4 * 2, -1), "Trajectory.tokens"),
        ("logprob on a prompt token", with_value("<f", 4 * T, -0.5), "behavior_logprobs: must be 0"),
        ("nan logprob", with_value("<f", 4 * T + 4 * 5, float("nan")), "finite log-probabilities"),
        ("version on a prompt token", with_value("<i", 8 * T, 0), "Trajectory.versions"),
        ("version below -1", with_value("<i", 8 * T, -2), "Trajectory.versions"),
        ("mask outside generated", with_value("B", 13 * T, 1), "Trajectory.loss_mask: is 1 at token 0"),
        ("tool calls not a list", with_record(turns=[[*first_turn[:3], 0]]), "malformed turns"),
        ("bad truncation", with_record(truncation=["sliced", 3, ""]), "malformed truncation"),
    ]


@pytest.mark.parametrize("label,blob,message", _corrupt_cases(), ids=[c[0] for c in _corrupt_cases()])
def test_corrupt_blob_is_rejected_with_a_clear_error(label, blob, message):
    with pytest.raises(CodecError, match=None) as err:
        decode(blob)
    assert message in str(err.value)


def test_a_group_round_trips_in_one_blob():
    group = [make_trajectory(index=i, seed=i, turn_lens=((i + 1, 2), (3, 0))) for i in range(5)]
    blob = encode_many(group)
    back = decode_many(blob)
    assert back == group
    assert [t.num_tokens for t in back] == [t.num_tokens for t in group]
    with pytest.raises(CodecError, match="holds 5 records"):
        decode(blob)
    assert decode_many(encode_many([])) == []


def test_an_invalid_member_fails_the_whole_group():
    group = [make_trajectory(index=i, seed=i) for i in range(3)]
    blob = bytearray(encode_many(group))
    header, body = _header_and_body(bytes(blob))
    total = sum(header["lens"])
    body_off = len(blob) - len(body)
    generated = np.frombuffer(body, dtype="u1", count=total, offset=12 * total)
    i = int(np.flatnonzero(generated)[-1])  # a generated token of the last record
    struct.pack_into("<i", blob, body_off + 8 * total + 4 * i, -1)  # its version, now missing
    with pytest.raises(CodecError, match="Trajectory.versions"):
        decode_many(bytes(blob))


def test_negative_zero_logprob_outside_generated_counts_as_zero():
    t = make_trajectory()
    blob = bytearray(encode(t))
    _, body = _header_and_body(bytes(blob))
    struct.pack_into("<f", blob, len(blob) - len(body) + 4 * t.num_tokens, -0.0)  # token 0, a prompt token
    assert decode(bytes(blob)) == t


def test_decode_accepts_bytearray_and_memoryview():
    t = make_trajectory()
    blob = encode(t)
    assert decode(bytearray(blob)) == t == decode(memoryview(blob))
    # a writable buffer still gives read-only arrays, so a decoded record cannot drift
    assert not any(getattr(decode(bytearray(blob)), name).flags.writeable for name in ("tokens", "loss_mask"))


def test_turn_spans_survive_round_trip():
    t = make_trajectory(turn_lens=((2, 1), (3, 0)))
    assert decode(encode(t)).turns == (Turn(5, 7, "stop", t.turns[0].tool_calls), Turn(8, 11, "stop", ()))
    assert np.array_equal(decode(encode(t)).loss_mask, t.loss_mask)
