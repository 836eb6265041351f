"""The binary codec: exact round trips, old blobs stay readable, corrupt blobs give clear errors."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pqrl.codec import (
    CURRENT_VERSION,
    MAGIC,
    CodecError,
    decode,
    decode_many,
    encode,
    encode_many,
    encode_parts,
)
from pqrl.trajectory import ToolCall, ToolStatus, Trajectory, TruncationKind, Turn
from tests.conftest import make_trajectory

GOLDEN_V1 = Path(__file__).parent / "data" / "trajectory_v1.bin"
GOLDEN_V2 = Path(__file__).parent / "data" / "group_v2.bin"


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


def _array_cases(blob: bytes, rebuild) -> list[tuple[str, bytes, str]]:
    """Blobs breaking one token-array rule each (the arrays' layout is the same in versions 2 and 3);
    ``blob`` holds one record whose first 5 tokens are its prompt."""
    header, body = _header_and_body(blob)
    T = sum(header["lens"])

    def with_values(*changes):  # (struct format, byte offset, value); token 0 is a prompt token
        changed = bytearray(body)
        for fmt, offset, value in changes:
            struct.pack_into(fmt, changed, offset, value)
        return rebuild(header, bytes(changed))

    def with_value(fmt, offset, value):
        return with_values((fmt, offset, value))

    return [
        ("truncated body", blob[:-5], "tokens need"),
        ("extra bytes", blob + b"\0\0\0\0", "tokens need"),
        ("invalid record", with_value("B", 12 * T, 7), "Trajectory.generated"),  # generated is 0/1
        ("negative token", with_value("<i", 4 * 2, -1), "Trajectory.tokens"),
        ("logprob on a prompt token", with_value("<f", 4 * T, -0.5), "behavior_logprobs: must be 0"),
        ("nan logprob", with_value("<f", 4 * T + 4 * 5, float("nan")), "finite log-probabilities"),
        ("version on a prompt token", with_value("<i", 8 * T, 0), "Trajectory.versions"),
        ("version below -1", with_value("<i", 8 * T, -2), "Trajectory.versions"),
        ("mask outside generated", with_value("B", 13 * T, 1), "Trajectory.loss_mask: is 1 at token 0"),
        # token 0 generated, with a version to match: only the prompt rule is broken
        (
            "generated prompt token",
            with_values(("B", 12 * T, 1), ("<i", 8 * T, 0)),
            "prompt tokens cannot be",
        ),
    ]


def _corrupt_cases():
    """Version 3 blobs, each breaking one rule the decoder checks."""
    blob = encode(make_trajectory(index=1))
    header, body = _header_and_body(blob)
    (T,) = header["lens"]

    def with_column(key, value):
        return _rebuild({**header, key: value}, body)

    def with_one(key, value):  # the only record's value of one field
        return with_column(key, [value])

    first_turn = header["turns"][0][0]
    without_run_id = {k: v for k, v in header.items() if k != "run_id"}
    return [
        ("empty", b"", "shorter than"),
        ("bad magic", b"XYZ" + blob[3:], "bad magic"),
        ("unknown version", blob[:3] + bytes([99]) + blob[4:], "unknown codec version 99"),
        ("header past end", blob[:4] + struct.pack("<I", 10**6) + blob[8:], "runs past"),
        ("garbage header", blob[:8] + b"\xc1" * 40 + blob[48:], "corrupt msgpack header"),
        ("header not a map", _rebuild([1, 2], body), "not a map"),
        ("missing lens", _rebuild({k: v for k, v in header.items() if k != "lens"}, body), "'lens'"),
        ("lens not counts", with_column("lens", [-1]), "not token counts"),
        ("missing field", _rebuild(without_run_id, body), "'run_id'"),
        ("column not a list", with_column("id", "g0-1"), "header field 'id' has type str"),
        ("column too long", with_column("env", ["calc-v1", "calc-v1"]), "2 values for the 1 records"),
        ("empty id", with_one("id", ""), "Trajectory.id: must be a non-empty string"),
        ("run_id not a string", with_one("run_id", 3), "Trajectory.run_id: must be a non-empty string"),
        ("prompt_len not an int", with_one("prompt_len", "5"), "Trajectory.prompt_len: must be an int"),
        ("prompt_len too long", with_one("prompt_len", T + 1), "Trajectory.prompt_len"),
        ("generated prompt", with_one("prompt_len", 6), "Trajectory.generated: prompt tokens"),
        ("reward not a number", with_one("reward", "1.5"), "header field 'reward' has type str"),
        ("nan reward", with_one("reward", float("nan")), "Trajectory.reward: must be finite"),
        ("reward_info not a map", with_one("reward_info", [1]), "header field 'reward_info' has type list"),
        ("timings not a map", with_one("timings", None), "header field 'timings' has type NoneType"),
        ("unknown status", with_one("status", "exploded"), "Trajectory.status"),
        ("turns not a list", with_one("turns", 3), "header field 'turns' has type int"),
        ("bad turns", with_one("turns", [[1]]), "malformed turns"),
        ("tool calls not a list", with_one("turns", [[*first_turn[:3], 0]]), "malformed turns"),
        (
            "bad tool status",
            with_one("turns", [[*first_turn[:3], [["calc", {}, "broken"]]]]),
            "malformed turns",
        ),
        (
            "turn bounds not ints",
            with_one("turns", [[5.0, 7, "stop", []]]),
            "Trajectory.turns: turn 0 span bounds",
        ),
        ("turn past the end", with_one("turns", [[5, T + 1, "stop", []]]), "Trajectory.turns: turn 0 span"),
        ("bad truncation", with_one("truncation", ["sliced", 3, ""]), "malformed truncation"),
        ("empty truncation", with_one("truncation", []), "malformed truncation"),
        ("truncation at a string", with_one("truncation", ["stop_episode", "3", ""]), "not a number"),
        (
            "truncation past the end",
            with_one("truncation", ["stop_episode", T + 1, ""]),
            "Trajectory.truncation",
        ),
        *_array_cases(blob, _rebuild),
    ]


def _v2_corrupt_cases():
    """Version 2 blobs (one map per record), each breaking one rule of that layout."""
    blob = _v2_blob()
    header, body = _header_and_body(blob)
    (T,) = header["lens"]
    (record,) = header["records"]

    def rebuild(h, b):
        return _rebuild(h, b, version=2)

    def with_record(**changes):
        return rebuild({**header, "records": [{**record, **changes}]}, body)

    without_run_id = {k: v for k, v in record.items() if k != "run_id"}
    return [
        ("missing field", rebuild({**header, "records": [without_run_id]}, body), "'run_id'"),
        ("wrong field type", with_record(prompt_len="5"), "Trajectory.prompt_len"),
        ("reward not a number", with_record(reward="high"), "'reward'"),
        ("bad turns", with_record(turns=[[1]]), "turns"),
        ("lens mismatch", rebuild({**header, "lens": [T, 3]}, body), "do not match"),
        ("record not a map", rebuild({**header, "records": [[1, 2]]}, body), "not a map"),
        ("missing lens", rebuild({"records": [record]}, body), "'lens'"),
        ("missing records", rebuild({"lens": [T]}, body), "'records'"),
        ("bad truncation", with_record(truncation=["sliced", 3, ""]), "malformed truncation"),
        *_array_cases(blob, rebuild),
    ]


def _v2_blob() -> bytes:
    """A version 2 blob of one record: the golden group's first member, its arrays kept as stored."""
    header, body = _header_and_body(GOLDEN_V2.read_bytes())
    total, (n, *_) = sum(header["lens"]), header["lens"]
    arrays = [
        body[off * total : off * total + size * n] for off, size in ((0, 4), (4, 4), (8, 4), (12, 1), (13, 1))
    ]
    return _rebuild({"lens": [n], "records": header["records"][:1]}, b"".join(arrays), version=2)


@pytest.mark.parametrize("label,blob,message", _corrupt_cases(), ids=[c[0] for c in _corrupt_cases()])
def test_corrupt_blob_is_rejected_with_a_clear_error(label, blob, message):
    with pytest.raises(CodecError) as err:
        decode(blob)
    assert message in str(err.value)


@pytest.mark.parametrize("label,blob,message", _v2_corrupt_cases(), ids=[c[0] for c in _v2_corrupt_cases()])
def test_corrupt_version_2_blob_is_rejected_with_a_clear_error(label, blob, message):
    assert blob[3] == 2
    with pytest.raises(CodecError) as err:
        decode(blob)
    assert message in str(err.value)


def test_golden_v2_group_still_decodes():
    # A version 2 blob (one header map per record) of a group: a layout change must keep it readable.
    back = decode_many(GOLDEN_V2.read_bytes())
    assert back == _golden_v2_group()
    assert decode(_v2_blob()) == _golden_v2_group()[0]
    assert encode_many(back)[3] == CURRENT_VERSION and decode_many(encode_many(back)) == back


def _golden_v2_group() -> list[Trajectory]:
    return [
        make_trajectory(index=i, seed=40 + i, turn_lens=((i + 1, 2), (3, 0)), reward=i / 2) for i in range(3)
    ]


def test_decoded_records_are_plain_frozen_records():
    group = [make_trajectory(index=i, seed=i) for i in range(2)]
    back = decode_many(encode_many(group))
    assert [type(t) for t in back] == [Trajectory, Trajectory]
    assert {type(u) for t in back for u in t.turns} == {Turn}
    with pytest.raises(dataclasses.FrozenInstanceError):
        back[0].reward = 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        back[0].turns[0].end = 0


def test_strided_arrays_encode_as_their_values():
    t = make_trajectory()
    wide = np.repeat(t.tokens, 2)[::2]  # a view without a contiguous buffer
    strided = Trajectory(**{**{f: getattr(t, f) for f in t.__dataclass_fields__}, "tokens": wide})
    assert not strided.tokens.flags.c_contiguous
    assert decode(encode(strided)) == t


def test_the_parts_of_a_blob_are_the_records_own_arrays_in_blob_order():
    group = [make_trajectory(index=i, seed=i) for i in range(3)]
    parts = encode_parts(group)
    assert b"".join(parts) == encode_many(group)
    # After the header: each array kind in blob order, record by record, not copied.
    arrays = parts[1:]
    names = ["tokens", "behavior_logprobs", "versions", "generated", "loss_mask"]
    assert len(arrays) == len(names) * len(group)
    for k, a in enumerate(arrays):
        assert a is getattr(group[k % len(group)], names[k // len(group)])
    # A strided record is converted to a contiguous copy of its values.
    t = group[0]
    strided = Trajectory(
        **{**{f: getattr(t, f) for f in t.__dataclass_fields__}, "tokens": np.repeat(t.tokens, 2)[::2]}
    )
    parts = encode_parts([strided])
    assert all(p.flags.c_contiguous for p in parts[1:]) and b"".join(parts) == encode(t)


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


@pytest.mark.parametrize("member", [0, 1, 2])
def test_each_member_is_checked_against_its_own_spans(member):
    # Records share the arrays: a generated token just inside one member's prompt must be found at
    # that member's offset, and the same token is fine where the prompt ends before it.
    group = [make_trajectory(index=i, seed=i, prompt_len=5 + i, turn_lens=((4, 3),)) for i in range(3)]
    blob = bytearray(encode_many(group))
    header, body = _header_and_body(bytes(blob))
    total, body_off = sum(header["lens"]), len(blob) - len(body)
    i = sum(header["lens"][:member]) + header["prompt_len"][member] - 1  # the member's last prompt token
    struct.pack_into("B", blob, body_off + 12 * total + i, 1)  # generated
    struct.pack_into("<i", blob, body_off + 8 * total + 4 * i, 0)  # with a version, as generated tokens have
    with pytest.raises(CodecError, match="Trajectory.generated: prompt tokens cannot be generated"):
        decode_many(bytes(blob))
    header["prompt_len"][member] -= 1
    back = decode_many(_rebuild(header, bytes(blob[body_off:])))
    assert back[member].generated[header["prompt_len"][member]] == 1


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


def test_a_calls_id_and_error_are_stored_only_when_set():
    t = make_trajectory(turn_lens=((2, 1), (3, 0)))
    bad = ToolCall.malformed("{oops", "Error: malformed tool call (invalid JSON)")
    calls = (ToolCall("calculator", {"expr": "1+1"}, ToolStatus.OK, id="call-0-0"), bad)
    t = dataclasses.replace(t, turns=(dataclasses.replace(t.turns[0], tool_calls=calls), *t.turns[1:]))
    back = decode(encode(t))
    assert back == t and back.turns[0].tool_calls[1].error == bad.error
    stored = _header_and_body(encode(t))[0]["turns"][0][0][3]
    assert stored == [
        ["calculator", {"expr": "1+1"}, "ok", "call-0-0"],
        ["<malformed>", {"raw": "{oops"}, "invalid", None, bad.error],
    ]
    # a call without them keeps the three values of records written before calls had ids
    plain = _header_and_body(encode(make_trajectory()))[0]["turns"][0][0][3]
    assert plain == [["calculator", {"expr": "0+1"}, "ok"]]


def test_calls_with_ids_get_a_new_version_and_version_3_blobs_still_decode():
    """A version 3 reader builds a call from exactly three values, so blobs whose calls carry an id
    are version 4 (an old reader refuses them by number); version 3 blobs decode as before."""
    t = make_trajectory()
    assert encode(t)[3] == 4
    header, body = _header_and_body(encode(t))
    assert decode(_rebuild(header, body, version=3)) == t


@pytest.mark.parametrize(
    "call, why",
    [
        (["calculator", {}, "ok", 7], "not a string"),
        (["calculator", {}, "ok", None, None, "x"], "3 to 5 values"),
        (["calculator", [], "ok"], "arguments map"),
        ("calculator", "3 to 5 values"),
    ],
)
def test_a_malformed_stored_call_is_a_codec_error(call, why):
    header, body = _header_and_body(encode(make_trajectory()))
    header["turns"][0][0][3] = [call]
    with pytest.raises(CodecError, match=why):
        decode(_rebuild(header, body))
