"""End to end per model family: a tiny random Llama, Qwen2, Mistral, Gemma2 and Qwen3 (built from a
config), each with a template in its family's style, served by the real built-in engine over
loopback HTTP; a forward hook forces the model to write the calc task's calls in its family's
format. The episode runs through the real agent loop and calc environment, and its tokens and loss
mask are checked token by token against the template's own renders."""

from __future__ import annotations

import asyncio

import pytest

from agent_loop.agent import EpisodeConfig, prompt_messages, run_episode
from agent_loop.tool_parser import as_openai_calls, get_parser
from engine.batcher import BatchEngine
from engine.client import EngineClient
from engine.http_app import create_app
from env_server.client import LocalEnvClient
from loss_masking import ChatRenderer, TemplateRewritesHistory
from loss_masking.chat_templates import BUILTIN_TEMPLATES, renderer_for
from pqrl.tool_calls import ToolCall, ToolStatus
from pqrl.trajectory import Status
from tasks.calc import SYSTEM, calc_suite
from tasks.storage import queued_task
from tests.agent_loop.family_models import FAMILIES, Script, model_for, tokenizer_for
from tests.servers import serve_in_thread

# how each family's prompt shows the worked example's first call
EXAMPLE_IN_PROMPT = {
    "llama": '{"name": "calculator", "parameters": {"expression": "',
    "qwen2": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "',
    "mistral": '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "',
    "gemma2": "```tool_code\ncalculator(expression='",
    "qwen3": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "',
}
THOUGHT = "<think>\nThe calculator does it.\n</think>\n\n"


def _episode(family_name: str, renderer: ChatRenderer, turns_text: list[str]):
    family = FAMILIES[family_name]
    model = model_for(family, len(renderer.tokenizer))
    stop = renderer.closing_ids[0]
    turns = [[*renderer.encode(text), stop] for text in turns_text]
    script = Script(model, turns)
    suite = calc_suite(1, seed=3)
    cfg = EpisodeConfig(max_turns=4, max_new_tokens=96, max_total_tokens=4096, tool_parser=family.parser,
                        stop_token_ids=(stop,), seed=0)  # fmt: skip

    async def run():
        env = LocalEnvClient()
        try:
            with serve_in_thread(create_app(BatchEngine(model, renderer.tokenizer, seed=0))) as url:
                engine = EngineClient(url)
                try:
                    t = await run_episode(queued_task(suite, 0), engine=engine, env=env, renderer=renderer,
                                          run_id="families", group_id=family_name, cfg=cfg)  # fmt: skip
                finally:
                    await engine.aclose()
            s = await env.create_session("calc-v1", suite.tasks[0].model_dump())
            return t, s.observation
        finally:
            await env.aclose()

    try:
        t, observation = asyncio.run(run())
    finally:
        script.close()
    return t, observation, turns, suite.tasks[0]


def _expected(renderer, observation, parser, turns, results):
    """The episode's tokens and loss mask as the template renders them, token by token."""
    messages, tools = prompt_messages(renderer, observation, parser)
    tokens = renderer.prompt(messages, tools)
    mask = [0] * len(tokens)
    for k, out in enumerate(turns):
        _, missing = renderer.split_closing(out)
        tokens += out + missing
        mask += [1] * len(out) + [0] * len(missing)
        if k < len(results):
            name, content, call_id = results[k]
            delta = renderer.delta(
                [{"role": "tool", "name": name, "content": content, "tool_call_id": call_id}]
            )
            tokens += delta
            mask += [0] * len(delta)
    return tokens, mask


def _check(t, observation, renderer, family_name, turns, task):
    parser = get_parser(FAMILIES[family_name].parser)
    assert t.status is Status.COMPLETED and t.reward == 1.0, t.reward_info
    assert [[(c.name, c.status) for c in turn.tool_calls] for turn in t.turns] == [
        [("calculator", ToolStatus.OK)],
        [("answer", ToolStatus.OK)],
    ]
    assert t.turns[0].tool_calls[0].arguments == {"expression": task.expression}
    ids = [c.id for turn in t.turns for c in turn.tool_calls]
    # the format's ids, after the worked example's two calls: Mistral's are 9 letters or digits
    assert ids == [parser.call_id(2), parser.call_id(3)] and len(set(ids)) == 2, ids
    if family_name == "mistral":
        assert all(len(i) == 9 and i.isalnum() for i in ids), ids
    tokens, mask = _expected(renderer, observation, parser, turns, [("calculator", task.answer, ids[0])])
    assert t.tokens.tolist() == tokens
    assert t.loss_mask.tolist() == mask and t.generated.tolist() == mask
    prompt = renderer.decode(t.tokens[: t.prompt_len])
    assert EXAMPLE_IN_PROMPT[family_name] in prompt, prompt
    return prompt


@pytest.mark.parametrize("family_name", ["llama", "qwen2", "mistral", "gemma2"])
def test_a_family_runs_an_episode_in_its_own_tool_call_format(family_name, tmp_path):
    family = FAMILIES[family_name]
    tok = tokenizer_for(family)
    template = family.template
    if template not in BUILTIN_TEMPLATES:  # the family's own template, from a file as a user gives it
        (tmp_path / "template.jinja").write_text(template)
        template = str(tmp_path / "template.jinja")
    renderer = renderer_for(tok, chat_template=template)
    parser = get_parser(family.parser)
    suite_task = calc_suite(1, seed=3).tasks[0]
    calls = [
        ToolCall("calculator", {"expression": suite_task.expression}),
        ToolCall("answer", {"value": suite_task.answer}),
    ]
    texts = [parser.render([c]) for c in calls]
    if family_name == "llama":  # Llama 3.1 writes <|python_tag|> before a call or not: both are read
        texts[0] = "<|python_tag|>" + texts[0]
    t, observation, turns, task = _episode(family_name, renderer, texts)
    prompt = _check(t, observation, renderer, family_name, turns, task)
    if family_name == "gemma2":  # no system role: its text opens the first user turn, logged once
        assert renderer.merges_system and "<start_of_turn>system" not in prompt
        assert prompt.index("<start_of_turn>user\n" + SYSTEM[:40]) < prompt.index("<start_of_turn>model")


def test_a_thinking_template_keeps_every_turn_as_generated():
    family = FAMILIES["qwen3"]
    with pytest.raises(TemplateRewritesHistory, match="model.template_history: as_generated"):
        renderer_for(tokenizer_for(family), chat_template="qwen3")
    renderer = renderer_for(tokenizer_for(family), chat_template="qwen3", history="as_generated")
    parser = get_parser("hermes")
    task = calc_suite(1, seed=3).tasks[0]
    texts = [THOUGHT + parser.render([ToolCall("calculator", {"expression": task.expression})]),
             THOUGHT + parser.render([ToolCall("answer", {"value": task.answer})])]  # fmt: skip
    t, observation, turns, task = _episode("qwen3", renderer, texts)
    _check(t, observation, renderer, "qwen3", turns, task)
    # the first turn's reasoning stays in the tokens the model saw next, and trains
    first = renderer.decode(t.tokens[t.turns[0].start : t.turns[0].end])
    assert "The calculator does it." in first and t.loss_mask[t.turns[0].start : t.turns[0].end].all()


def test_template_kwargs_reach_every_render():
    tok = tokenizer_for(FAMILIES["qwen3"])
    off = renderer_for(
        tok, chat_template="qwen3", history="as_generated", template_kwargs={"enable_thinking": False}
    )
    ids = off.prompt([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert off.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("family_name", ["llama", "qwen2", "mistral", "qwen3"])
def test_what_a_template_writes_for_tool_calls_its_parser_reads_back(family_name, tmp_path):
    family = FAMILIES[family_name]
    template = family.template
    if template not in BUILTIN_TEMPLATES:
        (tmp_path / "template.jinja").write_text(template)
        template = str(tmp_path / "template.jinja")
    r = renderer_for(tokenizer_for(family), chat_template=template, history="as_generated")
    assert r.renders_tool_calls
    calls = [
        ToolCall("run", {"command": "ls -l", "opts": {"n": [1, 2]}}),
        ToolCall("answer", {"value": "84"}),
    ]
    user = [{"role": "user", "content": "go"}]
    before = r.render(user, add_generation_prompt=True)
    parser = get_parser(family.parser)
    written = r.render(
        [*user, {"role": "assistant", "content": "", "tool_calls": as_openai_calls(calls, parser)}]
    )
    assert written.startswith(before)
    assert parser.parse(written[len(before) :]) == calls
