"""ChatRenderer: prompts, closing tokens and deltas from real templates; history-rewrite detection."""

from __future__ import annotations

import json

import pytest

from loss_masking import ChatRenderer, TemplateError, TemplateRewritesHistory, describe_tools
from tests.loss_masking import templates
from tests.loss_masking.templates import CALC, CALL, HOW_TO_CALL


def test_smollm_closing_and_generation_prompt_come_from_the_template(smollm, tok):
    assert smollm.closing_text == "<|im_end|>\n"
    assert smollm.closing_ids == tok.encode("<|im_end|>\n") == [tok.convert_tokens_to_ids("<|im_end|>"), 198]
    ids = smollm.prompt([{"role": "user", "content": "What is 6*7?"}])
    assert tok.decode(ids).endswith("What is 6*7?<|im_end|>\n<|im_start|>assistant\n")
    assert "You are a helpful AI assistant named SmolLM" in tok.decode(ids)  # the template's default system


def test_closing_is_derived_not_hard_coded(with_template, tok):
    r = ChatRenderer(with_template(templates.ENDOFTEXT_CLOSED))
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    assert r.closing_ids == [eot]
    assert r.split_closing([5, 6, eot]) == (2, [])
    assert r.split_closing([5, 6]) == (2, [eot])


def test_split_closing_finds_the_part_the_engine_generated(smollm):
    im_end, nl = smollm.closing_ids
    assert smollm.split_closing([7, 8, im_end]) == (2, [nl])  # stop token sampled by the model
    assert smollm.split_closing([7, 8, im_end, nl]) == (2, [])
    assert smollm.split_closing([7, 8]) == (2, [im_end, nl])  # stop string or length stop
    assert smollm.split_closing([7, nl]) == (2, [im_end, nl])  # a trailing newline is content
    assert smollm.split_closing([]) == (0, [im_end, nl])


def test_tools_block_rendered_by_template_that_has_one(hermes, tok):
    assert hermes.supports_tools
    text = tok.decode(hermes.prompt([{"role": "user", "content": "6*7?"}], [CALC]))
    assert "<tools>\n" + json.dumps(CALC) + "\n</tools>" in text
    assert text.endswith("<|im_start|>user\n6*7?<|im_end|>\n<|im_start|>assistant\n")


def test_template_without_tools_block_refuses_tools_and_caller_describes_them(smollm, tok):
    assert not smollm.supports_tools
    with pytest.raises(TemplateError, match="describe_tools"):
        smollm.prompt([{"role": "user", "content": "6*7?"}], [CALC])
    system = "You are a calculator agent.\n\n" + describe_tools([CALC], HOW_TO_CALL)
    text = tok.decode(
        smollm.prompt([{"role": "system", "content": system}, {"role": "user", "content": "6*7?"}])
    )
    assert json.dumps(CALC) in text and "<tool_call>" in text
    assert "SmolLM" not in text  # our system message replaced the default one


@pytest.mark.parametrize("role", ["tool", "user"])
def test_delta_is_the_in_context_suffix_at_every_point(renderer, role):
    """The same message gives the same tokens after any history, and they are exactly what the
    template renders (tokenized) when appended there."""
    obs = [{"role": role, "content": "42"}]
    d = renderer.delta(obs)
    tools = [CALC] if renderer.supports_tools else None
    histories = [
        [{"role": "user", "content": "6*7?"}, {"role": "assistant", "content": CALL}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "6*7?"},
            {"role": "assistant", "content": CALL},
            {"role": "tool", "content": "42"},
            {"role": "assistant", "content": "Let me check. " + CALL},
        ],
    ]
    for history in histories:
        before = renderer.encode(renderer.render(history, tools))
        after = renderer.encode(renderer.render(history + obs, tools, add_generation_prompt=True))
        assert after == before + d
    assert renderer.delta([dict(obs[0])]) == d


def test_hermes_groups_consecutive_tool_results_in_one_delta(hermes, tok):
    d = hermes.delta([{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}])
    assert tok.decode(d) == (
        "<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    final = hermes.delta([{"role": "tool", "content": "1"}], add_generation_prompt=False)
    assert tok.decode(final) == "<|im_start|>user\n<tool_response>\n1\n</tool_response><|im_end|>\n"


@pytest.mark.parametrize(
    ("template", "match"),
    [
        (templates.STRIPS_EARLIER_REASONING, "changes how messages 0..2 render"),
        (templates.GENERATION_PROMPT_MISMATCH, "generation prompt followed by its content"),
        (templates.COUNTS_FROM_END, "generation prompt followed by its content"),
    ],
)
def test_history_rewriting_templates_are_refused(with_template, template, match):
    with pytest.raises(TemplateRewritesHistory, match=match):
        ChatRenderer(with_template(template))


def test_check_history_names_the_rewritten_turn(with_template, smollm):
    conversation = [
        {"role": "user", "content": "6*7?"},
        {"role": "assistant", "content": "<think>six sevens</think>" + CALL},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "42"},
    ]
    smollm.check_history(conversation)  # ChatML renders history verbatim
    unchecked = ChatRenderer(with_template(templates.STRIPS_EARLIER_REASONING), verify=False)
    with pytest.raises(TemplateRewritesHistory, match="messages 2..2 changes how messages 0..1 render"):
        unchecked.check_history(conversation)


def test_check_history_catches_rewrites_the_probe_cannot_see(with_template):
    r = ChatRenderer(with_template(templates.TRIMS_CONTENT))  # the probe's messages have no edge spaces
    with pytest.raises(TemplateRewritesHistory, match=r"message 1 \(assistant\)"):
        r.check_history([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello  "}])


def test_tokens_merging_across_the_delta_boundary_are_refused(with_template):
    r = ChatRenderer(with_template(templates.MERGES_ACROSS_TURNS))  # text renders are consistent
    with pytest.raises(TemplateError, match="merges across the boundary"):
        r.delta([{"role": "tool", "content": "42"}])


def test_base_must_end_with_an_assistant_message(tok):
    with pytest.raises(TemplateError, match="must end with an assistant"):
        ChatRenderer(tok, base=[{"role": "user", "content": "x"}])
