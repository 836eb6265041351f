"""One tool-call record from the model's text to the Trajectory: parsed, run in the environment,
answered in the token stream, recorded with its id and status, stored and read back."""

from __future__ import annotations

import asyncio

import pytest

from agent_loop.agent import run_episode
from agent_loop.demonstrations import ExpertEngine
from agent_loop.tool_parser import tool_call_text
from env_server.client import LocalEnvClient
from loss_masking import ChatRenderer
from pqrl import codec
from pqrl.model_cache import load_tokenizer
from pqrl.tool_calls import MALFORMED, ToolCall, ToolStatus
from pqrl.trajectory import Status
from tasks.calc import calc_suite
from tasks.storage import queued_task


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(load_tokenizer())


def test_a_turns_calls_are_recorded_as_they_ended(renderer):
    suite = calc_suite(1, seed=7)
    task = suite.tasks[0]
    first = "<tool_call>{oops}</tool_call>" + tool_call_text("calculator", expression=task.expression)
    first += tool_call_text("nope", x=1)
    turns = [first, tool_call_text("answer", value=task.answer)]

    async def episode():
        client = LocalEnvClient()
        try:
            engine = ExpertEngine(renderer, lambda turn, _: turns[turn])
            return await run_episode(
                queued_task(suite, 0), engine=engine, env=client, renderer=renderer, run_id="r", group_id="g"
            )
        finally:
            await client.aclose()

    t = asyncio.run(episode())
    assert t.status is Status.COMPLETED and t.reward == 1.0, t.reward_info
    malformed, calculator, unknown = t.turns[0].tool_calls
    # ids number the conversation's calls after the worked example's (calculator, answer): every
    # call has one, the malformed one too, so each tool message answers to its call
    assert malformed.name == MALFORMED and malformed.status is ToolStatus.INVALID and malformed.id == "call_2"
    assert calculator == ToolCall("calculator", {"expression": task.expression}, ToolStatus.OK, id="call_3")
    assert unknown == ToolCall("nope", {"x": 1}, ToolStatus.INVALID, id="call_4")
    (answer,) = t.turns[1].tool_calls
    assert answer == ToolCall("answer", {"value": task.answer}, ToolStatus.OK, id="call_5")
    # the malformed call's error is its tool message, word for word, before the calculator's result
    observation = renderer.decode(t.tokens[t.turns[0].end : t.turns[1].start])
    assert malformed.error is not None and malformed.error.startswith("Error: malformed tool call (invalid")
    assert malformed.error in observation and "unknown tool 'nope'" in observation
    assert observation.index(malformed.error) < observation.index(str(task.answer))
    assert codec.decode(codec.encode(t)) == t  # ids and errors are stored with the calls


def test_a_call_inside_reasoning_is_never_run(tmp_path):
    """A template that opens ``<think>`` in the prompt (Qwen3-Thinking, DeepSeek-R1): the turn starts
    inside the block, so a call before ``</think>`` is a thought, not a call; the one after runs."""
    from loss_masking.chat_templates import renderer_for, resolve_template

    opening = resolve_template("chatml").replace(
        "{%- if add_generation_prompt %}<|im_start|>assistant\n",
        "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n",
    )
    assert opening != resolve_template("chatml")
    (tmp_path / "thinking.jinja").write_text(opening)
    renderer = renderer_for(
        load_tokenizer(), chat_template=str(tmp_path / "thinking.jinja"), history="as_generated"
    )
    task = calc_suite(1, seed=7).tasks[0]
    thought = f"I could just answer {tool_call_text('answer', value='-1')}.\n</think>\n"
    turns = [
        thought + tool_call_text("calculator", expression=task.expression),
        "</think>\n" + tool_call_text("answer", value=task.answer),
    ]

    async def episode():
        client = LocalEnvClient()
        try:
            engine = ExpertEngine(renderer, lambda turn, _: turns[turn])
            return await run_episode(
                queued_task(calc_suite(1, seed=7), 0),
                engine=engine,
                env=client,
                renderer=renderer,
                run_id="r",
                group_id="g",
            )
        finally:
            await client.aclose()

    t = asyncio.run(episode())
    # every turn starts inside the block the template opens: the second closes it at once
    assert [[c.name for c in turn.tool_calls] for turn in t.turns] == [["calculator"], ["answer"]]
    assert t.reward == 1.0, t.reward_info  # the answer of -1 in the reasoning was never submitted
