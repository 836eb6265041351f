"""Reward functions: the math of each built-in term and of their weighted sum, pure."""

from __future__ import annotations

import math

import pytest

from tasks.rewards import Episode, RewardTerm, combine, length_penalty, queued_terms, terms, tool_format


def brevity(ep: Episode, *, per_char: float = 0.01) -> float:
    """A user function, named tests.tasks.test_rewards:brevity."""
    return -per_char * len(ep.completion)


def broken(ep: Episode) -> float:
    raise RuntimeError("bug in a user function")


def not_a_number(ep: Episode) -> float:
    return math.nan


EP = Episode(env_reward=1.0, completion="x" * 50, tool_calls=4, ok_calls=3, generated_tokens=120)


def test_tool_format_is_the_share_of_calls_that_ran():
    assert tool_format(EP) == 0.75
    assert tool_format(Episode(env_reward=0.0)) == 0.0, "no call is no format credit"


@pytest.mark.parametrize(
    ("tokens", "limit", "buffer", "expected"),
    [
        (100, 128, 32, -0.125),
        (96, 128, 32, 0.0),
        (112, 128, 32, -0.5),
        (128, 128, 32, -1.0),
        (400, 128, 32, -1.0),
        (128, 128, 0, 0.0),
        (129, 128, 0, -1.0),
    ],
)
def test_length_penalty_is_dapo_overlong_shaping(tokens, limit, buffer, expected):
    assert (
        length_penalty(Episode(env_reward=0.0, generated_tokens=tokens), limit=limit, buffer=buffer)
        == expected
    )


def test_length_penalty_rejects_a_buffer_past_the_limit():
    with pytest.raises(ValueError, match="buffer"):
        length_penalty(EP, limit=10, buffer=20)


def test_weighted_sum_of_builtin_and_user_terms():
    spec = ["env", {"fn": "tool_format", "weight": 0.2},
            RewardTerm(fn="length_penalty", weight=0.5, args={"limit": 128, "buffer": 16}),
            RewardTerm(fn="tests.tasks.test_rewards:brevity", args={"per_char": 0.001})]  # fmt: skip
    total, values = combine(spec, EP)
    assert values == {"0:env": 1.0, "1:tool_format": 0.75, "2:length_penalty": -0.5,
                      "3:tests.tasks.test_rewards:brevity": -0.05}  # fmt: skip
    assert total == pytest.approx(1.0 + 0.2 * 0.75 - 0.5 * 0.5 - 0.05)


def test_the_environments_own_name_is_env():
    assert combine("exact_match", EP, env_names=("exact_match",)) == (1.0, {"0:env": 1.0})
    assert [t.fn for t in terms(["exact_match", "tool_format"], ("exact_match",))] == ["env", "tool_format"]
    assert queued_terms("exact_match") is None and queued_terms("env") is None, (
        "evaluate alone: nothing queued"
    )
    assert queued_terms(["qa_em_f1", "tool_format"]) == [
        {"fn": "env", "weight": 1.0, "args": {}},
        {"fn": "tool_format", "weight": 1.0, "args": {}},
    ]


@pytest.mark.parametrize(
    ("fn", "message"),
    [("nope", "unknown reward function 'nope'"), ("tests.tasks.test_rewards:missing", "cannot be loaded"),
     ("tests.tasks.test_rewards:broken", "RuntimeError: bug in a user function"),
     ("tests.tasks.test_rewards:not_a_number", "not a finite number")],
)  # fmt: skip
def test_a_bad_function_is_a_value_error_naming_it(fn, message):
    with pytest.raises(ValueError, match=message):
        combine([RewardTerm(fn=fn)], EP)


def test_weights_must_be_finite():
    with pytest.raises(ValueError):
        RewardTerm(fn="env", weight=math.inf)
