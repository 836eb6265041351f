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
        "suite": {**MANIFEST["suite"], "kind": "coding", "reward": "unit_tests", "env_id": "coding-v1"}
    }
    task = {"id": "b1", "kind": "coding", "repo": {"m.py": "x = 1\n"}, "issue": "x is wrong",
            "hidden_tests": {}, "fail_to_pass": []}  # fmt: skip
    with pytest.raises(SuiteInvalid) as err:
        parse_suite(_text(manifest, task))
    assert {p.field for p in err.value.problems} == {"hidden_tests", "fail_to_pass"}


# ---------------------------------------------------------------- the manifest against its environment


def _problems(*records) -> dict[tuple[int, str | None, str], str]:
    with pytest.raises(SuiteInvalid) as err:
        parse_suite(_text(*records))
    return {(p.line, p.task_id, p.field): p.reason for p in err.value.problems}


CALC = {"suite": {"name": "c", "version": "1", "env_id": "calc-v1", "kind": "calc", "reward": "exact_match"}}
CALC_TASK = {"id": "c1", "kind": "calc", "question": "1+1?", "answer": "2"}


@pytest.mark.parametrize(
    ("manifest", "field", "reason"),
    [
        ({"env_id": "calc-v9"}, "suite.env_id", "unknown environment 'calc-v9'; registered: "),
        ({"defaults": {"shots": 7}}, "suite.defaults.shots", "less than or equal to 2"),
        ({"defaults": {"shotz": 1}}, "suite.defaults.shotz", "Extra inputs are not permitted"),
        ({"defaults": {"format_reward": "lots"}}, "suite.defaults.format_reward", "valid number"),
        ({"reward": "qa_em_f1"}, "suite.reward", "unknown reward function 'qa_em_f1'"),
        ({"reward": ["env", {"fn": "no.such.module:f"}]}, "suite.reward.1", "cannot be loaded"),
        ({"kind": "qa"}, "suite.kind", "calc-v1 runs tasks of kind 'calc', not 'qa'"),
        ({"env_id": "search-v1", "kind": "qa", "defaults": {"corpus": [{"id": "d1", "title": "No text"}]}},
         "suite.defaults.corpus.0.text", "Field required"),
    ],
    ids=["unknown-env", "shots-range", "unknown-default", "default-type", "other-envs-reward", "user-fn",
         "kind-of-another-env", "corpus-without-text"],
)  # fmt: skip
def test_the_manifest_is_checked_against_its_environment(manifest, field, reason):
    found = _problems({"suite": {**CALC["suite"], **manifest}}, CALC_TASK)
    assert reason in found.get((1, None, field), ""), found


def test_tasks_of_an_unknown_environment_are_still_checked_by_their_kind():
    found = _problems({"suite": {**CALC["suite"], "env_id": "calc-v9"}}, {**CALC_TASK, "question": ""})
    assert (2, "c1", "question") in found and (1, None, "suite.env_id") in found


def test_the_reward_field_selects_the_scoring_and_travels_with_each_task():
    from tasks.storage import queued_task

    plain = parse_suite(_text(CALC, CALC_TASK))
    assert "reward" not in queued_task(plain, 0), "the environment's evaluate alone needs nothing queued"
    mixed = {"suite": {**CALC["suite"], "reward": ["exact_match", {"fn": "tool_format", "weight": 0.1}]}}
    queued = queued_task(parse_suite(_text(mixed, CALC_TASK)), 0)
    assert queued["reward"] == [{"fn": "env", "weight": 1.0, "args": {}},
                                {"fn": "tool_format", "weight": 0.1, "args": {}}]  # fmt: skip


def test_every_builtin_kind_is_a_registered_task_model():
    from env_server.registry import registry, task_kind
    from tasks.suite import CalcTask, CodingTask, DataTask, QATask

    models = {env_id: s.load_task_model() for env_id, s in registry().items()}
    assert {
        "calc-v1": CalcTask,
        "search-v1": QATask,
        "data-v1": DataTask,
        "coding-v1": CodingTask,
    }.items() <= models.items()
    assert {task_kind(m) for m in models.values() if m} >= {"calc", "qa", "data", "coding", "echo", "shell"}
