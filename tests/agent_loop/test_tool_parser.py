"""Tool-call parsing: well-formed calls, and every malformed shape becomes a message, not a crash."""

from __future__ import annotations

import pytest

from agent_loop.tool_parser import PARSERS, parse_tool_calls
from pqrl.tool_calls import MALFORMED, ToolCall, ToolStatus


def test_calls_in_order_with_surrounding_text():
    text = (
        'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>\n'
        '<tool_call> {"name": "answer", "arguments": "{\\"value\\": \\"6\\"}"} </tool_call> done'
    )
    assert parse_tool_calls(text) == [
        ToolCall("calculator", {"expression": "2*3"}),
        ToolCall("answer", {"value": "6"}),
    ]


def test_no_call_and_no_arguments():
    assert parse_tool_calls("The answer is 6.") == []
    assert parse_tool_calls('<tool_call>{"name": "submit"}</tool_call>') == [ToolCall("submit", {})]


@pytest.mark.parametrize(
    "text,error",
    [
        ("<tool_call>{name: x}</tool_call>", "invalid JSON"),
        ('<tool_call>{"name": "x", "arguments": {"a": 1}', "missing </tool_call>"),
        ("<tool_call>[1, 2]</tool_call>", "JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'missing "name"'),
        ('<tool_call>{"name": "x", "arguments": [1]}</tool_call>', "must be an object"),
        ('<tool_call>{"name": "x", "arguments": "not json"}</tool_call>', "string that is not JSON"),
    ],
)
def test_malformed_calls_explain_themselves(text, error):
    (call,) = parse_tool_calls(text)
    assert call.name == MALFORMED and call.status is ToolStatus.INVALID and not call.pending
    assert call.error is not None and error in call.error
    # the message the model is shown, word for word
    hint = 'Write <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> with valid JSON.'
    assert call.error.startswith("Error: malformed tool call (") and call.error.endswith(f"). {hint}")
    assert call.arguments == {"raw": text.removeprefix("<tool_call>").removesuffix("</tool_call>").strip()}


def test_too_many_calls_are_cut_with_a_note():
    text = '<tool_call>{"name": "a"}</tool_call>' * 5
    calls = parse_tool_calls(text, max_calls=3)
    assert [c.pending for c in calls] == [True] * 3 + [False]
    assert calls[-1].error is not None and "more than 3 calls" in calls[-1].error


def test_a_parser_is_text_to_calls_still_to_run():
    calls = PARSERS["hermes"]('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>')
    assert calls == [ToolCall("a", {"x": 1})] and calls[0].pending and calls[0].id is None


def test_a_name_the_env_server_would_refuse_is_malformed():
    (call,) = parse_tool_calls('<tool_call>{"name": "%s"}</tool_call>' % ("n" * 129))
    assert call.status is ToolStatus.INVALID and "longer than 128 characters" in (call.error or "")


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ('{"command": "sleep 400", "timeout": NaN}', "NaN is not a finite number"),
        ('{"timeout": Infinity}', "Infinity is not a finite number"),
        ('{"timeout": -Infinity}', "-Infinity is not a finite number"),
        ('{"timeout": 1e999}', "'1e999' is too large to be a number"),
        ('{"timeout": %s}' % ("9" * 400), "too large to be a number"),
        ('{"options": {"limits": [1, {"timeout": NaN}]}}', "NaN is not a finite number"),
        ('"{\\"timeout\\": NaN}"', "NaN is not a finite number"),  # arguments as a JSON string
        ('"{\\"timeout\\": 1e999}"', "too large to be a number"),
    ],
)
def test_a_non_finite_number_anywhere_makes_the_call_malformed(arguments, says):
    (call,) = parse_tool_calls('<tool_call>{"name": "run", "arguments": ' + arguments + "}</tool_call>")
    assert call.name == MALFORMED and call.status is ToolStatus.INVALID and not call.pending
    assert call.error is not None and says in call.error, call.error
    assert "numbers must be finite" in call.error, call.error


def test_finite_numbers_and_number_like_strings_still_parse():
    text = '<tool_call>{"name": "run", "arguments": {"timeout": 1e300, "n": -2, "s": "NaN"}}</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("run", {"timeout": 1e300, "n": -2, "s": "NaN"})]
