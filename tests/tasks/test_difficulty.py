"""Difficulty filtering: pass rates, the filtered suite and its report."""

from __future__ import annotations

import pytest

from tasks.calc import calc_suite
from tasks.difficulty import distribution_table, filter_suite, pass_rates


def test_pass_rates_and_filter_keep_only_informative_tasks():
    suite = calc_suite(4, seed=1)
    ids = [t.id for t in suite.tasks]
    rewards = {ids[0]: [0, 0, 0, 0], ids[1]: [1, 0, 0, 0], ids[2]: [1, 1, 1, 0], ids[3]: [1, 1, 1, 1]}
    rates = pass_rates(rewards)
    assert rates == {ids[0]: 0.0, ids[1]: 0.25, ids[2]: 0.75, ids[3]: 1.0}
    assert pass_rates({ids[0]: [1, 0], ids[1]: []}) == {ids[0]: 0.5}, "no sample ran: no rate, not 0"
    kept = filter_suite(suite, rates)
    assert [t.id for t in kept.tasks] == ids[1:3]  # c(1 - c) > 0 only strictly between 0 and 1
    assert kept.manifest.name == "calc-filtered" and "2 of 4 tasks" in kept.manifest.description
    assert kept.id != suite.id
    assert [t.id for t in filter_suite(suite, rates, low=0.5).tasks] == [ids[2]]
    with pytest.raises(ValueError):
        filter_suite(suite, rates, low=0.8, high=0.2)
    with pytest.raises(KeyError, match="no pass rate for 1 tasks"):
        filter_suite(suite, {k: v for k, v in rates.items() if k != ids[0]})


def test_distribution_table_counts_every_task_once():
    rates = {"a": 0.0, "b": 0.0, "c": 0.1, "d": 0.5, "e": 0.99, "f": 1.0}
    table = distribution_table(rates, bins=5)
    lines = table.splitlines()
    counts = [int(line.split()[-1]) for line in lines[:-1]]
    assert sum(counts) == 6 and counts[0] == 2 and counts[-1] == 1
    assert lines[-1].split()[-3:] == ["3", "of", "6"]
