"""The calc suite and its environment: gold answers score 1, wrong or missing ones 0."""

from __future__ import annotations

import random

import pytest

from env_server.client import LocalEnvClient
from env_server.conformance import check_environment
from env_server.types import ToolCall
from tasks.calc import SYSTEM, calc_suite, make_calc_task, safe_eval

SUITE = calc_suite(24, seed=11)


def test_generation_is_deterministic_and_answers_are_right():
    assert calc_suite(24, seed=11) == SUITE
    assert len({t.id for t in SUITE.tasks}) == 24
    for t in SUITE.tasks:
        assert str(int(safe_eval(t.expression))) == t.answer
        assert int(t.answer) > 0
    questions = {t.question.split(" ")[1] for t in calc_suite(200, seed=1).tasks}
    assert len(questions) >= 4, "several story templates are used"


@pytest.mark.parametrize(
    "expr", ["__import__('os')", "open('x')", "2 ** 1000", "a + 1", "[1, 2]", "1 if 1 else 2", "x" * 600]
)
def test_safe_eval_rejects_anything_but_arithmetic(expr):
    with pytest.raises(ValueError):
        safe_eval(expr)


def test_safe_eval_arithmetic():
    assert safe_eval("12 * (3 + 4) - -2") == 86
    assert safe_eval("7 / 2") == 3.5 and safe_eval("7 // 2") == 3 and safe_eval("2 ** 10") == 1024


@pytest.fixture
async def client():
    c = LocalEnvClient()
    yield c
    await c.aclose()


@pytest.mark.parametrize("task", SUITE.tasks, ids=[t.id for t in SUITE.tasks])
async def test_gold_scores_one_and_wrong_or_missing_scores_zero(client, task):
    s = await client.create_session("calc-v1", task.model_dump())
    step = await client.step(
        s.session_id, [ToolCall(name="calculator", arguments={"expression": task.expression})]
    )
    assert step.messages[0].content == task.answer
    end = await client.step(
        s.session_id, [ToolCall(name="answer", arguments={"value": step.messages[0].content})]
    )
    assert end.done
    assert (await client.evaluate(s.session_id)).reward == 1.0
    await client.close_session(s.session_id)

    wrong = await client.create_session("calc-v1", task.model_dump())
    await client.step(
        wrong.session_id, [ToolCall(name="answer", arguments={"value": str(int(task.answer) + 1)})]
    )
    assert (await client.evaluate(wrong.session_id)).reward == 0.0
    silent = await client.create_session("calc-v1", task.model_dump())
    assert (await client.evaluate(silent.session_id)).reward == 0.0


async def test_prompt_carries_the_worked_example_only_when_asked(client):
    task = make_calc_task(random.Random(5), "calc-x").model_dump()
    one = await client.create_session("calc-v1", task)
    roles = [m.role for m in one.observation.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "user"]
    assert one.observation.messages[0].content == SYSTEM
    assert "<tool_call>" in one.observation.messages[2].content
    assert one.observation.messages[-1].content == task["question"]


async def test_calc_env_conforms():
    await check_environment("calc-v1")
