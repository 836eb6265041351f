"""Expert calc demonstrations: recorded through the real agent loop and environment, they decode to
the conversation the environment saw, train exactly the expert's turns, and round-trip on disk."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import agent_loop.demonstrations as demonstrations
from agent_loop.agent import prompt_messages
from agent_loop.demonstrations import (
    calc_demonstrations,
    read_demonstrations,
    resolve_demonstrations,
    tool_call_text,
    write_demonstrations,
)
from agent_loop.tool_parser import get_parser, parse_tool_calls
from env_server.client import LocalEnvClient
from loss_masking import ChatRenderer
from pqrl.model_cache import load_tokenizer
from pqrl.tool_calls import ToolStatus
from pqrl.trajectory import Status
from tasks.calc import calc_suite

N, SEED = 6, 1000


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(load_tokenizer())


@pytest.fixture(scope="module")
def demos(renderer):
    return calc_demonstrations(N, SEED, renderer)


async def _initial_messages(task, renderer) -> list[dict]:
    client = LocalEnvClient()
    try:
        s = await client.create_session("calc-v1", task.model_dump(), env_kwargs={"shots": 1})
        return prompt_messages(renderer, s.observation, get_parser("hermes"))[0]
    finally:
        await client.aclose()


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True))


def test_demonstrations_decode_to_the_conversation_the_env_saw(renderer, demos):
    suite = calc_suite(N, SEED)
    assert [d.task_id for d in demos] == [t.id for t in suite.tasks]
    for d, task in zip(demos, suite.tasks, strict=True):
        assert d.status is Status.COMPLETED and d.reward == 1.0
        assert d.reward_info["submitted"] == task.answer and d.env == "calc-v1"
        conversation = [
            *asyncio.run(_initial_messages(task, renderer)),
            {"role": "assistant", "content": tool_call_text("calculator", expression=task.expression)},
            {"role": "tool", "name": "calculator", "content": task.answer},
            {"role": "assistant", "content": tool_call_text("answer", value=task.answer)},
        ]
        # the whole token stream is the template's render of that conversation, nothing more
        assert renderer.decode(d.tokens) == renderer.render(conversation)
        assert renderer.decode(d.tokens[: d.prompt_len]) == renderer.render(
            conversation[:-3], add_generation_prompt=True
        )
        calls = [[(c.name, c.arguments, c.status) for c in turn.tool_calls] for turn in d.turns]
        assert calls == [
            [("calculator", {"expression": task.expression}, "ok")],
            [("answer", {"value": task.answer}, "ok")],
        ]


def test_masks_are_one_exactly_on_the_experts_turns(renderer, demos):
    stop = renderer.closing_ids[0]
    for d in demos:
        spans = [(t.start, t.end) for t in d.turns]
        assert _runs(d.loss_mask) == spans, "one mask-1 run per expert turn, nothing else"
        assert np.array_equal(d.loss_mask, d.generated)
        gen = d.generated.astype(bool)
        assert set(d.versions[gen]) == {0} and set(d.versions[~gen]) == {-1}
        assert not d.behavior_logprobs.any()
        for start, end in spans:
            text = renderer.decode(d.tokens[start : end - 1])
            assert d.tokens[end - 1] == stop, "the expert's turn ends with the stop token it 'sampled'"
            assert d.tokens[start : end - 1].tolist() == renderer.encode(text), "canonical tokens"
            (call,) = parse_tool_calls(text)
            assert call.pending
        # only the newline after the last <|im_end|> follows the last turn: it closes, nobody sampled it
        assert d.tokens[spans[-1][1] :].tolist() == renderer.closing_ids[1:]


def test_the_environment_grades_the_expert(renderer, monkeypatch):
    real_expert = demonstrations.calc_expert

    def lying_expert(expression: str, parser: str):
        honest = real_expert(expression, parser)
        return lambda turn, text: honest(turn, text) if turn == 0 else tool_call_text("answer", value="-1")

    monkeypatch.setattr(demonstrations, "calc_expert", lying_expert)
    with pytest.raises(RuntimeError, match="reward 0.0"):
        calc_demonstrations(1, SEED, renderer)


def test_write_read_round_trip_and_specs(renderer, demos, tmp_path):
    path = write_demonstrations(tmp_path / "sub" / "calc.pqrl", demos)
    back = read_demonstrations(path)
    assert [t.id for t in back] == [t.id for t in demos]
    for a, b in zip(back, demos, strict=True):
        for name in ("tokens", "generated", "loss_mask", "behavior_logprobs", "versions"):
            assert np.array_equal(getattr(a, name), getattr(b, name))
        assert a.turns == b.turns and a.reward == b.reward and a.prompt_len == b.prompt_len
    assert [t.id for t in resolve_demonstrations(str(path), renderer)] == [t.id for t in demos]
    built = resolve_demonstrations("calc:2:5", renderer)
    assert [t.task_id for t in built] == ["calc-5-0", "calc-5-1"]
    with pytest.raises(ValueError, match="calc:N"):
        resolve_demonstrations("calc:two", renderer)


@pytest.mark.parametrize("shots", [0, 1])
@pytest.mark.parametrize("parser", ["pythonic", "mistral"])
def test_the_expert_writes_the_format_the_policy_will_write(renderer, parser, shots):
    from agent_loop.config import EpisodeConfig

    (d,) = calc_demonstrations(1, SEED, renderer, shots=shots, cfg=EpisodeConfig(tool_parser=parser))
    assert d.reward == 1.0
    head = "[calculator(" if parser == "pythonic" else '[TOOL_CALLS][{"name": "calculator"'
    assert renderer.decode(d.tokens[d.turns[0].start : d.turns[0].end]).startswith(head)
    prompt = renderer.decode(d.tokens[: d.prompt_len])
    assert "<tool_call>" not in prompt
    # the worked example shows the format; without one, the system message spells it out
    assert (head in prompt) == bool(shots) and (get_parser(parser).example in prompt) == (not shots)


@pytest.mark.timeout(300)
def test_a_suite_files_worked_examples_are_demonstrations_run_in_sandboxes(renderer):
    """``suite:PATH:N``: any environment's worked examples, played through the real agent loop and
    environment (coding-v1: a Docker sandbox per episode), each earning 1, masks on the calls only."""
    from pathlib import Path

    from tasks.coding.generate import SUITE_PATH

    assert Path(SUITE_PATH).is_file()
    demos = demonstrations.resolve_demonstrations(f"suite:{SUITE_PATH}:2", renderer)
    assert len(demos) == 2 and all(t.status is Status.COMPLETED and t.reward == 1.0 for t in demos)
    for t in demos:
        made = [c for turn in t.turns for c in turn.tool_calls]
        assert len(t.turns) >= 2 and len(made) == len(t.turns), "one call of the worked example a turn"
        assert all(c.status is ToolStatus.OK for c in made), made
        trained = renderer.decode([tok for tok, m in zip(t.tokens, t.loss_mask, strict=True) if m])
        assert [c.name for c in parse_tool_calls(trained)] == [c.name for c in made], trained[:500]
