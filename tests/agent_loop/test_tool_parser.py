"""Tool-call parsing: well-formed calls, and every malformed shape becomes a message, not a crash."""

from __future__ import annotations

import pytest

from agent_loop.tool_parser import MalformedCall, ParsedCall, parse_tool_calls


def test_calls_in_order_with_surrounding_text():
    text = (
        'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>\n'
        '<tool_call> {"name": "answer", "arguments": "{\\"value\\": \\"6\\"}"} </tool_call> done'
    )
    assert parse_tool_calls(text) == [
        ParsedCall("calculator", {"expression": "2*3"}),
        ParsedCall("answer", {"value": "6"}),
    ]


def test_no_call_and_no_arguments():
    assert parse_tool_calls("The answer is 6.") == []
    assert parse_tool_calls('<tool_call>{"name": "submit"}</tool_call>') == [ParsedCall("submit", {})]


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
    assert isinstance(call, MalformedCall) and error in call.error
    assert call.message.startswith("Error: malformed tool call") and "<tool_call>" in call.message


def test_too_many_calls_are_cut_with_a_note():
    text = '<tool_call>{"name": "a"}</tool_call>' * 5
    calls = parse_tool_calls(text, max_calls=3)
    assert [type(c) for c in calls] == [ParsedCall] * 3 + [MalformedCall]
    assert "more than 3 calls" in calls[-1].error
