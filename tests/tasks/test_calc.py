"""The calc suite and its environment: gold answers score 1, wrong or missing ones 0."""

from __future__ import annotations

import random
import re

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


FORMAT = {"format_reward": 0.2}
TASK = make_calc_task(random.Random(3), "calc1-x", level=1)  # "{a} op {b}" from the question's numbers


async def _episode(client, calls: list[tuple[str, dict]]) -> float:
    s = await client.create_session("calc-v1", TASK.model_dump(), env_kwargs=FORMAT)
    for name, arguments in calls:
        await client.step(s.session_id, [ToolCall(name=name, arguments=arguments)])
    reward = (await client.evaluate(s.session_id)).reward
    await client.close_session(s.session_id)
    return reward


async def test_format_reward_credits_computing_from_the_problem_and_submitting_the_result(client):
    a, b = TASK.expression.split(" ")[::2]
    other = f"{a} * {b}" if "*" not in TASK.expression else f"{a} + {b}"
    wrong = str(int(safe_eval(other)))
    assert wrong != TASK.answer
    # the procedure with the wrong operation: both halves of the credit
    assert (
        await _episode(client, [("calculator", {"expression": other}), ("answer", {"value": wrong})]) == 0.2
    )
    # computed from the problem's numbers but submitted something else: half
    assert await _episode(client, [("calculator", {"expression": other}), ("answer", {"value": "7"})]) == 0.1
    assert await _episode(client, [("calculator", {"expression": other})]) == 0.1
    # a guess submitted at once earns nothing (this was gamed when it did)
    assert await _episode(client, [("answer", {"value": wrong})]) == 0.0
    # a calculator call on numbers not in the problem, then its result: nothing
    assert (
        await _episode(client, [("calculator", {"expression": "1585"}), ("answer", {"value": "1585"})]) == 0.0
    )
    assert (
        await _episode(client, [("calculator", {"expression": "3 * 7"}), ("answer", {"value": "21"})]) == 0.0
    )
    # an exact answer scores 1 however it was found
    assert await _episode(client, [("answer", {"value": TASK.answer})]) == 1.0


async def test_format_reward_follows_a_multi_step_computation(client):
    task = SUITE.tasks[0]
    first = re.search(r"\d+ \* \d+", task.expression).group()  # every template has a product a * b
    s = await client.create_session("calc-v1", task.model_dump(), env_kwargs=FORMAT)
    step = await client.step(s.session_id, [ToolCall(name="calculator", arguments={"expression": first})])
    partial = step.messages[0].content
    # an intermediate result is a known quantity for the next call
    step = await client.step(
        s.session_id,
        [ToolCall(name="calculator", arguments={"expression": f"{partial} + {first.split()[0]}"})],
    )
    await client.step(s.session_id, [ToolCall(name="answer", arguments={"value": step.messages[0].content})])
    assert (await client.evaluate(s.session_id)).reward == pytest.approx(0.2)


async def test_prompt_carries_the_worked_example_only_when_asked(client):
    task = make_calc_task(random.Random(5), "calc-x").model_dump()
    one = await client.create_session("calc-v1", task)
    roles = [m.role for m in one.observation.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "user"]
    assert one.observation.messages[0].content == SYSTEM
    # the worked example's call is structured: the agent loop writes it in the model's own format
    example = one.observation.messages[2]
    assert example.content == "" and example.tool_calls is not None
    assert [(c.name, list(c.arguments)) for c in example.tool_calls] == [("calculator", ["expression"])]
    assert one.observation.messages[-1].content == task["question"]


async def test_calc_env_conforms():
    await check_environment("calc-v1")
