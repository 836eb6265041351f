"""The coding suite: shipped file, deterministic regeneration, mutation operators, issue texts."""

from __future__ import annotations

import ast
import json

import pytest

from tasks.coding.diffs import source_files, split_patch
from tasks.coding.generate import SUITE_PATH, coding_suite, run_tests, source_repos, visible_tests
from tasks.coding.mutations import mutations
from tasks.coding.policy import check_source
from tasks.suite import CodingTask, load_suite

SUITE = load_suite(SUITE_PATH)
TASKS: list[CodingTask] = [t for t in SUITE.tasks if isinstance(t, CodingTask)]


def test_the_shipped_suite_validates_and_has_at_least_50_distinct_tasks():
    assert SUITE.manifest.env_id == "coding-v1"
    assert (SUITE.manifest.kind, SUITE.manifest.reward) == ("coding", "unit_tests")
    assert len(TASKS) == len(SUITE.tasks) >= 50
    assert len({t.id for t in TASKS}) == len(TASKS)
    buggy = {json.dumps(t.repo, sort_keys=True) for t in TASKS}
    assert len(buggy) == len(TASKS), "every task has its own bug"
    assert len({t.id.split("-")[0] for t in TASKS}) >= 8, "bugs spread over many modules"


@pytest.mark.parametrize("task", TASKS, ids=[t.id for t in TASKS])
def test_every_task_is_well_formed(task):
    sources = source_files(task.repo, task.hidden_tests)
    assert len(sources) == 1 and sources[0].endswith(".py")
    # F2P and P2P partition the hidden tests; the visible tests are exactly the P2P ones.
    (test_path, hidden), *_ = task.hidden_tests.items()
    names = [
        n.name
        for n in ast.parse(hidden).body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    ]
    assert sorted(task.fail_to_pass + task.pass_to_pass) == sorted(f"{test_path}::{n}" for n in names)
    assert not set(task.fail_to_pass) & set(task.pass_to_pass)
    visible = [n.name for n in ast.parse(task.repo[test_path]).body if isinstance(n, ast.FunctionDef)]
    assert sorted(f"{test_path}::{n}" for n in visible if n.startswith("test_")) == sorted(task.pass_to_pass)
    # The gold patch is a small git-style diff of the source file only.
    (part,) = split_patch(task.gold_patch)
    assert part.old_path == part.new_path == sources[0]
    assert sum(line.startswith(("+", "-")) for line in part.lines[3:]) <= 12
    # The issue shows the reproduction and the error, not the module's code at the bug.
    assert "```python" in task.issue and sources[0] in task.issue
    changed = [x[1:].strip() for x in part.lines[3:] if x.startswith(("-", "+")) and len(x.strip()) > 12]
    assert not any(line in task.issue for line in changed)
    # The buggy source obeys the policy the grader enforces on submissions.
    assert check_source(sources[0], task.repo[sources[0]].encode()) == []


def test_regeneration_is_deterministic():
    regenerated = coding_suite(seed=0, modules=["roman", "rle"])
    shipped = [t for t in TASKS if t.id.split("-")[0] in ("roman", "rle")]
    assert list(regenerated.tasks) == shipped
    other_seed = coding_suite(seed=1, modules=["roman"])
    assert [t.repo for t in other_seed.tasks] != [t.repo for t in shipped if t.id.startswith("roman")]


def test_original_modules_pass_their_tests_and_the_policy():
    repos = source_repos()
    assert len(repos) >= 8
    for repo in repos:
        assert repo.source.isascii()
        assert check_source(repo.source_path, repo.source.encode(), repo.source.encode()) == []
    results = run_tests(
        {repos[0].source_path: repos[0].source, repos[0].test_path: repos[0].tests}, [repos[0].test_path]
    )
    assert results and all(o.outcome == "passed" for o in results.values())


SNIPPET = """\
def f(xs, n):
    \"\"\"Docstring 10 + 1.\"\"\"
    total = 0
    for i in range(1, n):
        if xs[i] < xs[i - 1] and n > 2:
            total += xs[i] * 2
    flag = True
    return min(total, 100) if flag else -total
"""


def test_mutation_operators():
    found = {(m.kind, m.description) for m in mutations(SNIPPET)}
    for expected in [
        ("swap_comparison", "`<` -> `<=`"),
        ("swap_comparison", "`>` -> `>=`"),
        ("swap_boolean", "`and` -> `or`"),
        ("swap_operator", "`-` -> `+`"),
        ("swap_operator", "`*` -> `/`"),
        ("swap_operator", "`+=` -> `-=`"),
        ("off_by_one", "`2` -> `3`"),
        ("drop_term", "dropped `- 1`"),
        ("swap_arguments", "swapped the first two arguments"),
        ("swap_min_max", "`min` -> `max`"),
        ("flip_boolean", "`True` -> `False`"),
        ("swap_branches", "swapped the branches"),
        ("negate_condition", "negated the condition"),
        ("drop_unary", "dropped `-`"),
        ("remove_statement", "removed `flag = True`"),
    ]:
        assert expected in found
    for m in mutations(SNIPPET):
        mutated = m.apply(SNIPPET)
        ast.parse(mutated)
        assert '"""Docstring 10 + 1."""' in mutated, "docstrings are never mutated"
        assert mutated.count("\n") >= SNIPPET.count("\n") - 2, "edits stay local"
    assert len({m.apply(SNIPPET) for m in mutations(SNIPPET)}) == len(list(mutations(SNIPPET)))


def test_visible_tests_drop_whole_functions():
    source = (
        "import pytest\n\n\ndef test_a():\n    assert 1\n\n\n@pytest.mark.slow\ndef test_b():\n    assert 2\n"
    )
    assert visible_tests(source, {"test_b"}) == "import pytest\n\n\ndef test_a():\n    assert 1\n"


def test_issue_text_for_an_assertion():
    task = next(t for t in TASKS if t.id == "roman-00")
    assert task.issue.startswith("roman: to roman subtractive pairs is broken (it returns a wrong result)")
    assert 'assert to_roman(400) == "CD"' in task.issue
    assert "assert 'CCCC' == 'CD'" in task.issue
    assert "tests/test_roman.py" not in task.issue, "the hidden test file is not named"
