"""The generic forgers (tests/tasks/repo_forgery.py) on two repo-v1 tasks of a small project written
here, graded with real Docker: one task checked unittest-style (``self.assertEqual``), one
pytest-style with a ``pytest.raises``. By values (the default) the gold scores 1, the empty patch 0
and every forger 0, none making the grading raise; by JUnit alone the report-rewriting forger scores
1, so the battery cannot pass because the forgers do nothing. A kept test compares values of the
container's own environment: each gold run of the reference is in a container of its own, so they
are unstable, not a check the gold passes and every submission fails."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sandboxes.docker_api import DockerAPI
from tests.tasks.conftest import leftovers
from tests.tasks.repo_forgery import REPO_FORGERS, Bug, Built, battery, build

RUN = "pytest-repo-forgers"
pytestmark = pytest.mark.timeout(600)

CORE = """\
class TallyError(ValueError):
    pass


def count(iterable):
    return sum(1 for _ in iterable)


def mean(values):
    values = list(values)
    if not values:
        raise TallyError("mean of nothing")
    return sum(values) / len(values)


def chunks(seq, n):
    return [list(seq[i : i + n]) for i in range(0, len(seq), n)]
"""
TESTS = """\
import os
import unittest

import pytest

import tally


class CountTests(unittest.TestCase):
    def test_count(self):
        self.assertEqual(tally.count(iter([1, 2, 3])), 3)
        self.assertEqual(tally.count([]), 0)

    def test_count_is_an_int(self):
        self.assertTrue(isinstance(tally.count("ab"), int))


class TestMean:
    def test_mean(self):
        assert tally.mean([1, 2, 3, 5]) == 2.75

    def test_empty(self):
        with pytest.raises(tally.TallyError, match="nothing"):
            tally.mean([])


class TestChunks:
    def test_chunks_of_the_environment(self):  # differs from one container to the next
        assert tally.chunks(sorted(os.environ.values()), 1000) == [sorted(os.environ.values())]

    def test_chunks(self):
        assert tally.chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]

    def test_none(self):
        assert tally.chunks([], 3) == []
"""
BUGS = [
    Bug("count", "tally/core.py", "return sum(1 for _ in iterable)\n",
        "return sum(1 for _ in iterable) + 1\n", "tests/test_core.py", "CountTests"),
    Bug("mean", "tally/core.py",
        '    if not values:\n        raise TallyError("mean of nothing")\n'
        "    return sum(values) / len(values)\n",
        "    return sum(values) // max(len(values), 1)\n", "tests/test_core.py", "TestMean"),
]  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    project = tmp_path_factory.mktemp("project")
    (project / "tally").mkdir()
    (project / "tests").mkdir()
    (project / "tally" / "__init__.py").write_text("from tally.core import *  # noqa: F403\n")
    (project / "tally" / "core.py").write_text(CORE)
    (project / "tests" / "test_core.py").write_text(TESTS)
    return build(project, BUGS, "pqrl-test-tally", tmp_path_factory.mktemp("work"), p2p_count=2)


@pytest.fixture
async def api() -> AsyncIterator[DockerAPI]:
    api = DockerAPI()
    yield api
    left = await leftovers(api, RUN)
    await api.close()
    assert left == []


def test_the_tasks_are_what_the_bugs_break(built):
    count, mean = built.tasks
    assert count.fail_to_pass == ["tests/test_core.py::CountTests::test_count"]
    assert mean.fail_to_pass == [
        "tests/test_core.py::TestMean::test_empty",
        "tests/test_core.py::TestMean::test_mean",
    ]
    assert all(t.pass_to_pass and "TestChunks" in t.pass_to_pass[0] for t in built.tasks)


async def test_by_values_gold_scores_1_and_empty_and_every_forger_0(api, built):
    results = await battery(api, built, RUN)
    raised = {k: r for k, r in results.items() if isinstance(r, BaseException)}
    assert raised == {}
    rewards = {k: r.reward for k, r in results.items() if not isinstance(r, BaseException)}
    assert {k for k, r in rewards.items() if r > 0} == {("gold", t.id) for t in built.tasks}
    assert {who for who, _ in rewards} >= {"gold", "empty", *REPO_FORGERS} - {
        "f3_eq_edit"
    }  # no __eq__ to edit
    assert {r.info["verdict"] for r in results.values() if not isinstance(r, BaseException)} == {"values"}


async def test_by_junit_alone_the_report_rewriter_scores(api, built):
    results = await battery(api, built, RUN, verdict="junit", forgers=["f7_report_rewrite"])
    assert {k: r.reward for k, r in results.items() if not isinstance(r, BaseException)} == {
        (who, t.id): 0.0 if who == "empty" else 1.0
        for t in built.tasks
        for who in ("gold", "empty", "f7_report_rewrite")
    }
