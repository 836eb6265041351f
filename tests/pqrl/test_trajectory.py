"""The Trajectory record's invariants: every rejected record names the offending field."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pqrl.codec import _from_columns
from pqrl.trajectory import (
    Status,
    ToolCall,
    ToolStatus,
    Trajectory,
    TrajectoryError,
    Truncation,
    TruncationKind,
    Turn,
    check_token_arrays,
)
from tests.conftest import make_trajectory


def _fields(t: Trajectory) -> dict:
    return {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}


def _with(t: Trajectory, **changes) -> Trajectory:
    return Trajectory(**{**_fields(t), **changes})


def test_valid_record_converts_dtypes_and_counts():
    t = make_trajectory()
    assert t.tokens.dtype == np.int32 and t.generated.dtype == np.uint8
    assert t.behavior_logprobs.dtype == np.float32 and t.versions.dtype == np.int32
    assert t.num_tokens == 5 + 4 + 3 + 2 and t.num_generated == 6
    assert t.status is Status.COMPLETED
    lists = _with(t, tokens=t.tokens.tolist(), generated=t.generated.tolist())
    assert lists == t and lists.tokens.dtype == np.int32


def test_masked_out_generated_span_keeps_its_logprobs():
    t = make_trajectory()
    mask = t.loss_mask.copy()
    mask[5:9] = 0  # an invalid turn: generated, logprobs kept, not trained on
    t2 = _with(t, loss_mask=mask)
    assert t2.loss_mask.sum() == 2 and np.all(t2.behavior_logprobs[5:9] < 0)


def _bad_cases():
    t = make_trajectory()
    T = t.num_tokens
    ones = np.ones(T, np.uint8)
    gen_with_2 = t.generated.copy()
    gen_with_2[6] = 2
    mask_outside = t.loss_mask.copy()
    mask_outside[0] = 1
    versions_wrong = t.versions.copy()
    versions_wrong[0] = 0
    versions_missing = t.versions.copy()
    versions_missing[5] = -1
    lp_prompt = t.behavior_logprobs.copy()
    lp_prompt[0] = -0.5
    lp_nan = t.behavior_logprobs.copy()
    lp_nan[5] = np.nan
    return [
        ("tokens", {"tokens": t.tokens[:-1]}, "generated"),  # shorter tokens -> first mismatched field
        ("generated", {"generated": ones[:-1]}, "generated"),
        ("loss_mask", {"loss_mask": t.loss_mask[:-2]}, "loss_mask"),
        ("behavior_logprobs", {"behavior_logprobs": t.behavior_logprobs[1:]}, "behavior_logprobs"),
        ("versions", {"versions": t.versions[1:]}, "versions"),
        ("mask values", {"generated": gen_with_2}, "generated"),
        ("mask subset", {"loss_mask": mask_outside}, "loss_mask"),
        ("version on prompt", {"versions": versions_wrong}, "versions"),
        ("version missing", {"versions": versions_missing}, "versions"),
        ("logprob outside generated", {"behavior_logprobs": lp_prompt}, "behavior_logprobs"),
        ("logprob nan", {"behavior_logprobs": lp_nan}, "behavior_logprobs"),
        ("2-D tokens", {"tokens": t.tokens.reshape(1, -1)}, "tokens"),
        ("float tokens", {"tokens": t.tokens.astype(np.float64)}, "tokens"),
        ("negative token", {"tokens": np.where(np.arange(T) == 2, -1, t.tokens)}, "tokens"),
        ("token overflow", {"tokens": t.tokens.astype(np.int64) + 2**31}, "tokens"),
        ("prompt_len too long", {"prompt_len": T + 1}, "prompt_len"),
        ("prompt_len type", {"prompt_len": 5.0}, "prompt_len"),
        ("generated prompt", {"prompt_len": 7}, "generated"),
        ("turn out of range", {"turns": (Turn(5, T + 3),)}, "turns"),
        ("turns overlap", {"turns": (Turn(5, 9), Turn(8, 14))}, "turns"),
        ("turn in prompt", {"turns": (Turn(2, 9),)}, "turns"),
        ("status", {"status": "exploded"}, "status"),
        ("reward nan", {"reward": float("nan")}, "reward"),
        ("reward type", {"reward": "high"}, "reward"),
        ("empty id", {"id": ""}, "id"),
        ("run_id type", {"run_id": 3}, "run_id"),
        ("truncation", {"truncation": Truncation("stop_episode", T + 1)}, "truncation"),
    ]


@pytest.mark.parametrize("label,changes,field", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_rejected_records_name_the_field(label, changes, field):
    t = make_trajectory()
    with pytest.raises(TrajectoryError) as err:
        _with(t, **changes)
    assert err.value.field == field
    assert f"Trajectory.{field}:" in str(err.value)


def test_empty_trajectory_is_valid():
    empty = np.zeros(0)
    t = _with(
        make_trajectory(),
        tokens=empty,
        generated=empty,
        loss_mask=empty,
        behavior_logprobs=empty,
        versions=empty,
        prompt_len=0,
        turns=(),
        truncation=None,
    )
    assert t.num_tokens == 0


def test_failed_infra_status_round_trips_as_enum():
    t = _with(make_trajectory(), status="failed_infra", reward=0)
    assert t.status is Status.FAILED_INFRA and t.reward == 0.0


def test_tool_status_and_truncation_kind_are_enums_built_from_their_strings():
    assert ToolCall("calc", {}, "timeout").status is ToolStatus.TIMEOUT
    assert ToolCall("calc").status is None and ToolStatus.ERROR == "error"  # None: not run yet
    assert Truncation("stop_episode", 3).kind is TruncationKind.STOP_EPISODE
    with pytest.raises(ValueError, match="tool call status 'broken' is not one of"):
        ToolCall("calc", {}, "broken")
    with pytest.raises(TrajectoryError, match="truncation: kind 'cut'"):
        Truncation("cut", 3)


def test_record_arrays_are_read_only_views():
    t = make_trajectory()
    with pytest.raises(ValueError):
        t.loss_mask[0] = 1  # would break "loss_mask within generated" after validation
    mine = np.zeros(t.num_tokens, np.uint8)
    t2 = _with(t, loss_mask=mine)
    assert mine.flags.writeable and not t2.loss_mask.flags.writeable


def test_token_checks_want_uint8_masks():
    # 0/1 masks are read as bools without a copy, which only holds for one-byte arrays
    t = make_trajectory()
    arrays = {k: getattr(t, k) for k in ("tokens", "generated", "loss_mask", "behavior_logprobs", "versions")}
    check_token_arrays(**arrays)
    with pytest.raises(TypeError, match="generated must be uint8, got int32"):
        check_token_arrays(**{**arrays, "generated": t.generated.astype(np.int32)})


def _columns(records: list[Trajectory]) -> tuple[dict, list[int], dict]:
    arrays = {k: np.concatenate([getattr(t, k) for t in records]) for k in _ARRAYS}
    others = [f for f in Trajectory.__dataclass_fields__ if f not in _ARRAYS]
    return arrays, [t.num_tokens for t in records], {f: [getattr(t, f) for t in records] for f in others}


_ARRAYS = ("tokens", "generated", "loss_mask", "behavior_logprobs", "versions")


def test_records_built_from_columns_equal_the_constructed_ones():
    records = [make_trajectory(index=i, seed=i, prompt_len=3 + i) for i in range(3)]
    built = _from_columns(*_columns(records))
    assert built == records and [type(t) for t in built] == [Trajectory] * 3
    assert all(not t.tokens.flags.writeable for t in built)


def _column_cases():
    """The bad cases whose arrays keep their dtype and shape: converting those is the caller's job
    (the codec reads arrays as stored), so the column builder is not asked to."""
    t = make_trajectory()
    return [
        c
        for c in _bad_cases()
        if all(
            np.ndim(v) == 1 and np.asarray(v).dtype == getattr(t, k).dtype
            for k, v in c[1].items()
            if k in _ARRAYS
        )  # fmt: skip
    ]


@pytest.mark.parametrize("label,changes,field", _column_cases(), ids=[c[0] for c in _column_cases()])
def test_records_built_from_columns_are_checked_as_one_record_is(label, changes, field):
    # The same rules, checked column by column and over the concatenated arrays: a bad second
    # record is rejected naming the same field as its constructor does.
    t = make_trajectory()
    bad = {**_fields(t), **changes}
    _, _, columns = _columns([t, t])
    arrays = {k: np.concatenate([getattr(t, k), bad[k]]) for k in _ARRAYS}
    lens = [t.num_tokens, len(bad["tokens"])]
    columns = {k: [v[0], bad[k]] for k, v in columns.items()}
    with pytest.raises(TrajectoryError) as err:
        _from_columns(arrays, lens, columns)
    assert err.value.field == field


@pytest.mark.parametrize(
    "call",
    [ToolCall("calc", {"x": 1}), {"name": "calc", "arguments": {}, "status": "ok"}],
    ids=["pending", "dict"],
)
def test_a_turn_records_only_tool_calls_that_have_run(call):
    t = make_trajectory(turn_lens=((2, 1), (3, 0)))
    with pytest.raises(TrajectoryError, match="turn 0 records .* not a ToolCall that has run"):
        dataclasses.replace(t, turns=(dataclasses.replace(t.turns[0], tool_calls=(call,)), *t.turns[1:]))
