"""The suite format: round trips, content ids, and every problem reported with its location."""

from __future__ import annotations

import json

import pytest

from tasks.calc import calc_suite
from tasks.suite import SuiteInvalid, parse_suite

MANIFEST = {
    "suite": {"name": "qa-mini", "version": "1", "env_id": "search-v1", "kind": "qa", "reward": "qa_em_f1"}
}


def _text(*records) -> str:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n"


def test_round_trip_and_content_id():
    suite = calc_suite(5, seed=3)
    again = parse_suite(suite.to_jsonl())
    assert again == suite and again.id == suite.id
    assert suite.id.startswith("calc@") and len(suite.digest) == 12
    assert calc_suite(5, seed=4).digest != suite.digest
    assert calc_suite(5, seed=3).digest == suite.digest, "the id is a pure function of the content"


def test_every_problem_is_reported_with_line_task_and_field():
    text = _text(
        MANIFEST,
        {"id": "q1", "kind": "qa", "question": "Who?", "answers": ["Ada"]},
        {"id": "q2", "kind": "qa", "question": "", "answers": []},  # two field problems
        "{not json",
        {"id": "q1", "kind": "qa", "question": "Again?", "answers": ["x"]},  # duplicate id
        {"id": "c1", "kind": "calc", "question": "1+1?", "answer": "2"},  # wrong kind for the suite
        {"id": "Bad Id!", "kind": "qa", "question": "?", "answers": ["a"]},
        {"id": "q9", "kind": "essay", "prompt": "?"},
        {"id": "q10", "kind": "qa", "question": "?", "answers": ["a"], "extra": 1},
    )
    with pytest.raises(SuiteInvalid) as err:
        parse_suite(text, source="mini.jsonl")
    found = {(p.line, p.task_id, p.field) for p in err.value.problems}
    assert (3, "q2", "question") in found and (3, "q2", "answers") in found
    assert any(p.line == 4 and p.field == "(json)" for p in err.value.problems)
    assert (5, "q1", "id") in found
    assert (6, "c1", "kind") in found
    assert (7, "Bad Id!", "id") in found
    assert any(p.line == 8 and p.task_id == "q9" for p in err.value.problems)
    assert (9, "q10", "extra") in found
    assert "mini.jsonl: " in str(
        err.value
    ) and "line 5 (task q1): id: duplicate of the task on line 2" in str(err.value)


@pytest.mark.parametrize(
    "text,field",
    [
        ("", "suite"),
        (_text({"id": "q1", "kind": "qa", "question": "?", "answers": ["a"]}), "suite"),
        (_text({"suite": {**MANIFEST["suite"], "reward": "vibes"}}), "suite.reward"),
        (_text({"suite": {**MANIFEST["suite"], "name": "Has Spaces"}}), "suite.name"),
        (_text(MANIFEST), "tasks"),
    ],
    ids=["empty", "no-manifest", "bad-reward", "bad-name", "no-tasks"],
)
def test_malformed_manifests(text, field):
    with pytest.raises(SuiteInvalid) as err:
        parse_suite(text)
    assert field in [p.field for p in err.value.problems]


def test_coding_tasks_need_hidden_tests_and_fail_to_pass():
    manifest = {
        "suite": {**MANIFEST["suite"], "kind": "coding", "reward": "unit_tests", "env_id": "shell-v1"}
    }
    task = {"id": "b1", "kind": "coding", "repo": {"m.py": "x = 1\n"}, "issue": "x is wrong",
            "hidden_tests": {}, "fail_to_pass": []}  # fmt: skip
    with pytest.raises(SuiteInvalid) as err:
        parse_suite(_text(manifest, task))
    assert {p.field for p in err.value.problems} == {"hidden_tests", "fail_to_pass"}
