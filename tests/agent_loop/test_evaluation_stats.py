"""The evaluation's arithmetic: the unbiased pass@k estimator, Wilson's and the bootstrap interval,
and the summary that counts infrastructure failures apart and refuses a pass rate over tasks that
never ran."""

from __future__ import annotations

import math

import pytest

from agent_loop.difficulty import Sample
from agent_loop.evaluation import TaskOutcome, bootstrap_interval, pass_at_k, summarize, wilson_interval

OK, WRONG = Sample(1.0, turns=2), Sample(0.0, turns=1)
INFRA = Sample(0.0, failed_infra=True, error="could not open a session: sandbox unavailable")


def test_pass_at_k_matches_hand_computed_values_and_its_edges():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - 35 / 210)  # 1 - C(7,4)/C(10,4)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # k = 1: the plain pass rate
    assert pass_at_k(3, 0, 3) == 0.0 and pass_at_k(3, 1, 3) == 1.0  # n = k: any pass passes
    assert pass_at_k(6, 0, 2) == 0.0 and pass_at_k(6, 6, 2) == 1.0  # c = 0, c = n
    assert pass_at_k(6, 5, 2) == 1.0  # n - c < k: every draw of k holds a pass
    for bad in ((2, 0, 3), (3, 4, 2), (3, -1, 2), (3, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_wilson_interval_matches_hand_computed_values_and_stays_in_0_1():
    low, high = wilson_interval(5, 10)  # p 0.5, z 1.96: 0.5 -+ 1.4160 * sqrt(0.025 + 0.0096)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    low, high = wilson_interval(0, 4)  # nothing passed: still an upper bound, z^2 / (n + z^2)
    assert low == 0.0 and high == pytest.approx(3.8415 / 7.8415, abs=1e-4)
    low, high = wilson_interval(4, 4)
    assert high == 1.0 and low == pytest.approx(4 / 7.8415, abs=1e-4)
    for bad in ((1, 0), (3, 2), (-1, 2)):
        with pytest.raises(ValueError):
            wilson_interval(*bad)


def test_bootstrap_interval_is_seeded_and_brackets_the_mean():
    values = [0.0, 0.5, 1.0, 1.0, 0.0, 0.25, 0.75, 1.0]
    low, high = bootstrap_interval(values)
    mean = sum(values) / len(values)
    assert 0.0 <= low < mean < high <= 1.0
    assert bootstrap_interval(values) == (low, high), "the same outcomes give the same interval"
    # the spread of a mean of 8 values with sd ~0.42 is ~0.15: a 95% interval about 4 of those wide
    assert 0.35 < high - low < 0.75
    assert bootstrap_interval([1.0, 1.0]) == (1.0, 1.0)  # no spread to resample
    with pytest.raises(ValueError):
        bootstrap_interval([])


def test_infrastructure_failures_are_counted_apart_not_scored_as_wrong():
    tasks = [TaskOutcome("a", OK, (OK, WRONG)), TaskOutcome("b", WRONG, (WRONG, WRONG)),
             TaskOutcome("c", OK, (OK, OK)), TaskOutcome("d", OK, (WRONG, OK)),
             TaskOutcome("e", INFRA, (INFRA, OK))]  # fmt: skip
    result = summarize(tasks, k=2, max_failed_infra=0.25)
    m = result.metrics
    assert m["eval/tasks"] == 5 and m["eval/tasks_run"] == 4 and m["eval/failed_infra"] == 2
    assert m["eval/pass@1"] == 0.75, "3 of the 4 tasks that ran, not 3 of 5"
    assert (m["eval/pass@1_low"], m["eval/pass@1_high"]) == wilson_interval(3, 4)
    assert result.solved == {"a": True, "b": False, "c": True, "d": True}, "e never ran: no outcome"
    # e has one sample that ran, fewer than k: out of pass@k too
    assert m["eval/tasks_run@k"] == 4 and m["eval/pass@k"] == pytest.approx((1 + 0 + 1 + 1) / 4)
    assert not result.refused
    line = tasks[4].record(2)
    assert line["task_id"] == "e" and line["greedy"]["failed_infra"] and line["greedy"]["passed"] is None
    assert "sandbox unavailable" in line["greedy"]["error"] and line["pass@2"] is None
    assert tasks[0].record(2)["samples"][1] == {
        "reward": 0.0,
        "passed": False,
        "failed_infra": False,
        "turns": 1,
    }


def test_no_pass_rate_when_nothing_ran_or_too_many_tasks_failed_on_infrastructure():
    nothing = summarize([TaskOutcome(t, INFRA, (INFRA, INFRA)) for t in "abc"], k=2)
    assert "eval/pass@1" not in nothing.metrics and "eval/pass@k" not in nothing.metrics
    assert nothing.pass_at_1 is None and nothing.solved == {}
    assert nothing.metrics["eval/tasks_run"] == 0 and nothing.metrics["eval/failed_infra"] == 9
    why = nothing.refused["eval/pass@1"]
    assert why.startswith("no task ran: 3 of 3") and "sandbox unavailable" in why
    assert set(nothing.refused) == {"eval/pass@1", "eval/pass@k"}

    half = [TaskOutcome("a", OK), TaskOutcome("b", INFRA), TaskOutcome("c", WRONG), TaskOutcome("d", INFRA)]
    refused = summarize(half, k=1, max_failed_infra=0.25)
    assert (
        refused.pass_at_1 is None
        and "2 of 4 tasks failed on infrastructure" in refused.refused["eval/pass@1"]
    )
    assert summarize([], k=1).refused == {"eval/pass@1": "the suite has no task"}
    allowed = summarize(half, k=1, max_failed_infra=0.5)  # at the stated share: reported
    assert allowed.pass_at_1 == 0.5 and not allowed.refused and "eval/pass@k" not in allowed.metrics


def test_every_task_wrong_or_right_still_has_an_interval():
    wrong = summarize([TaskOutcome(t, WRONG, (WRONG, WRONG)) for t in "abcd"], k=2)
    assert wrong.pass_at_1 == 0.0 and wrong.metrics["eval/pass@1_high"] > 0.4  # 0 of 4 proves little
    assert wrong.metrics["eval/pass@k"] == 0.0
    right = summarize([TaskOutcome(t, OK, (OK, OK)) for t in "abcd"], k=2)
    assert right.pass_at_1 == 1.0 and right.metrics["eval/pass@1_low"] < 0.6
    assert math.isclose(right.metrics["eval/pass@k"], 1.0)
