"""Every built-in tool-call format: well-formed calls, several calls, text around them, malformed
calls answered with the format's own instructions, and render -> parse round trips."""

from __future__ import annotations

import pytest

from agent_loop.tool_parser import PARSERS, UnknownToolParser, get_parser, parse_tool_calls
from pqrl.tool_calls import MALFORMED, ToolCall, ToolStatus

CALC = ToolCall("calculator", {"expression": "12 * (3 + 4)"})
ANSWER = ToolCall("answer", {"value": "84"})
NESTED = ToolCall("run", {"command": "ls -l", "timeout": 30, "opts": {"env": ["A=1"], "deep": None}})
SCHEMAS = [
    {"type": "function", "function": {"name": "answer", "parameters": {
        "properties": {"value": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "run", "parameters": {"properties": {
        "command": {"type": "string"}, "timeout": {"type": "integer"}, "opts": {"type": "object"}}}}},
]  # fmt: skip

# (format, model text with prose around two calls)
WELL_FORMED = {
    "hermes": 'Let me see. <tool_call>{"name": "calculator", '
    '"arguments": {"expression": "12 * (3 + 4)"}}</tool_call>\n'
    '<tool_call>{"name": "answer", "arguments": {"value": "84"}}</tool_call> done',
    "qwen3_coder": "First I compute.\n<tool_call>\n<function=calculator>\n"
    "<parameter=expression>\n12 * (3 + 4)\n"
    "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=answer>\n<parameter=value>\n84\n"
    "</parameter>\n</function>\n</tool_call>",
    "llama3_json": '<|python_tag|>{"name": "calculator", "parameters": {"expression": "12 * (3 + 4)"}}; '
    '{"name": "answer", "parameters": {"value": "84"}}',
    "mistral": 'Sure. [TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "12 * (3 + 4)"}}, '
    '{"name": "answer", "arguments": {"value": "84"}}]',
    "pythonic": 'I will call:\n[calculator(expression="12 * (3 + 4)"), answer(value="84")]\nand wait.',
    "gemma": 'Computing now.\n```tool_code\ncalculator(expression="12 * (3 + 4)")\n'
    'print(answer(value="84"))\n```\n',
}

# (format, malformed text, what the error says)
MALFORMED_CASES = [
    ("hermes", "<tool_call>{name: x}</tool_call>", "invalid JSON"),
    (
        "qwen3_coder",
        "<tool_call>\n<function=answer>\n<parameter=value>\n84\n</parameter>\n",
        "missing </function>",
    ),
    (
        "qwen3_coder",
        "<function=run>\n<parameter=timeout>\nsoon\n</parameter>\n</function>",
        "not JSON of type integer",
    ),
    ("qwen3_coder", "<function=>\n</function>", 'missing "name"'),
    ("llama3_json", '<|python_tag|>{"name": "answer", "parameters": {"value": }', "invalid JSON"),
    ("llama3_json", "<|python_tag|>answer 84", "no JSON call"),
    ("llama3_json", '{"name": "run", "parameters": {"timeout": NaN}}', "numbers must be finite"),
    ("mistral", '[TOOL_CALLS][{"name": "answer", "arguments": {"value": 84]', "invalid JSON"),
    ("mistral", "[TOOL_CALLS] answer please", "JSON list of calls"),
    ("mistral", '[TOOL_CALLS][{"arguments": {}}]', 'missing "name"'),
    ("pythonic", "[answer(value=84, ]", "not a Python list"),
    ("pythonic", "[answer(84)]", "given by name"),
    ("pythonic", "[run(timeout=1e999)]", "numbers must be finite"),
    ("pythonic", "[run(timeout=os.system('x'))]", "not a literal"),
    ("gemma", '```tool_code\nanswer(value="84"\n```', "not Python"),
    ("gemma", '```tool_code\nanswer(value="84")\n', "missing the closing"),
    ("gemma", "```tool_code\nx = 1\n```", "one call"),
]


@pytest.mark.parametrize("fmt", sorted(WELL_FORMED))
def test_two_calls_with_text_around(fmt):
    assert get_parser(fmt).parse(WELL_FORMED[fmt], tools=SCHEMAS) == [CALC, ANSWER]


@pytest.mark.parametrize("fmt", sorted(WELL_FORMED))
def test_plain_text_is_no_call(fmt):
    assert get_parser(fmt).parse("The answer is 84 [see above] {not a call} print(x)") == []


@pytest.mark.parametrize(("fmt", "text", "says"), MALFORMED_CASES)
def test_malformed_calls_get_the_formats_instructions(fmt, text, says):
    parser = get_parser(fmt)
    (call,) = [c for c in parser.parse(text, tools=SCHEMAS) if not c.pending]
    assert call.name == MALFORMED and call.status is ToolStatus.INVALID
    assert call.error is not None and says in call.error, call.error
    assert call.error.startswith("Error: malformed tool call (") and call.error.endswith(
        f"Write {parser.example}"
    )


@pytest.mark.parametrize("fmt", sorted(PARSERS))
@pytest.mark.parametrize("calls", [[CALC], [CALC, ANSWER], [NESTED, ANSWER]])
def test_render_then_parse_gives_the_calls_back(fmt, calls):
    parser = get_parser(fmt)
    text = parser.render(calls)
    assert parser.parse(f"Thinking first.\n{text}", tools=SCHEMAS) == calls, text


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_too_many_calls_are_cut_with_a_note(fmt):
    parser = get_parser(fmt)
    calls = parser.parse(parser.render([ANSWER] * 5), max_calls=3)
    assert [c.pending for c in calls] == [True] * 3 + [False], calls
    assert "more than 3 calls" in (calls[-1].error or "")


def test_formats_read_their_other_spellings():
    assert get_parser("llama3_json").parse('{"name": "answer", "arguments": {"value": "84"}}') == [ANSWER]
    assert get_parser("mistral").parse('[TOOL_CALLS]answer[ARGS]{"value": "84"}') == [ANSWER]
    assert get_parser("mistral").parse('[TOOL_CALLS]answer[CALL_ID]a1b2c3d4e[ARGS]{"value": "84"}') == [
        ANSWER
    ]
    assert get_parser("qwen3_coder").parse(
        "<function=answer>\n<parameter=value>\n84\n</parameter>\n</function>"
    ) == [ToolCall("answer", {"value": "84"})]
    # a Qwen3-Coder call read with the hermes parser names the setting that reads it
    (call,) = parse_tool_calls("<tool_call>\n<function=answer>\n</function>\n</tool_call>")
    assert "model.tool_parser: qwen3_coder" in (call.error or "")


def test_an_unknown_parser_names_the_known_ones():
    with pytest.raises(UnknownToolParser, match="unknown tool parser 'nope'") as e:
        get_parser("nope")
    assert e.value.exit_code == 2 and "qwen3_coder" in e.value.fix


def test_a_plugin_registers_a_parser_through_its_entry_point(tmp_path, monkeypatch):
    import agent_loop.tool_parser as registry

    (tmp_path / "my_fmt.py").write_text(
        "from agent_loop.tool_formats import ToolFormat\n"
        "def _find(text, calls, tools):\n"
        "    for line in text.splitlines():\n"
        "        if line.startswith('CALL '):\n"
        "            calls.decode(line[5:])\n"
        "FMT = ToolFormat('x', _find,"
        " lambda n, a: 'CALL ' + __import__('json').dumps({'name': n, 'arguments': a}),"
        ' \'CALL {"name": ..., "arguments": {...}}\')\n'
    )
    dist = tmp_path / "my_fmt-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-fmt\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pqrl.tool_parsers]\nline_json = my_fmt:FMT\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    monkeypatch.setattr(registry, "PARSERS", dict(registry.PARSERS))
    parser = get_parser("line_json")
    assert parser.name == "line_json"
    assert parser.parse('hi\nCALL {"name": "answer", "arguments": {"value": "84"}}') == [ANSWER]
    assert "CALL {" in parser.parse("CALL {oops")[0].error


@pytest.mark.parametrize(
    "text",
    [
        "[f(a=1" + "]" * 20_000,  # one parse, not one per bracket
        "[f(a=" + "(" * 5_000 + "1" + ")" * 5_000 + ")]",  # nesting past the parser's limit
        '[f(a="\x00")]',
        "```tool_code\n" + "f(a=" + "[" * 5_000 + "]" * 5_000 + ")\n```",
        "```tool_code\nf(a='\x00')\n```",
    ],
)
def test_hostile_python_calls_are_malformed_quickly(text):
    import time

    fmt = "gemma" if text.startswith("```") else "pythonic"
    t0 = time.perf_counter()
    calls = get_parser(fmt).parse(text)
    assert time.perf_counter() - t0 < 2.0
    assert calls and all(c.name == MALFORMED or c.pending for c in calls)
    assert any(c.name == MALFORMED for c in calls) or calls == [ToolCall("f", {"a": "\x00"})]


def test_qwen3_coder_values_follow_the_tools_schema():
    schemas = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {
        "s": {"type": "string"}, "n": {"type": "integer"}, "either": {"type": ["string", "integer"]},
        "maybe": {"type": ["string", "null"]}, "o": {"type": "object"}}}}}]  # fmt: skip
    text = "".join(
        f"<parameter={k}>\n{v}\n</parameter>\n"
        for k, v in [
            ("s", "84"),
            ("n", "84"),
            ("either", "NaN"),
            ("maybe", "[1]"),
            ("o", '{"a": 1}'),
            ("free", "7"),
        ]
    )
    (call,) = get_parser("qwen3_coder").parse(f"<function=f>\n{text}</function>", tools=schemas)
    assert call.arguments == {"s": "84", "n": 84, "either": "NaN", "maybe": "[1]", "o": {"a": 1}, "free": "7"}
    (bad,) = get_parser("qwen3_coder").parse(
        "<function=f>\n<parameter=n>\nNaN\n</parameter>\n</function>", tools=schemas
    )
    assert bad.name == MALFORMED and "NaN is not a finite number" in (bad.error or ""), bad.error


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_nesting_too_deep_for_the_decoder_is_a_malformed_call_not_a_crash(fmt):
    parser = get_parser(fmt)
    deep = "[" * 5000 + "]" * 5000
    texts = [parser.render([ToolCall("run", {"opts": 1})]).replace("1", deep)]
    texts.append(f"<tool_call>{deep}</tool_call>")
    for text in texts:
        for call in parser.parse(text, tools=SCHEMAS):  # no RecursionError escapes
            assert call.pending or call.name == MALFORMED


def test_a_qwen3_coder_schema_with_a_boolean_property_parses():
    tools = [{"function": {"name": "run", "parameters": {"properties": {"x": True}}}}]
    text = "<function=run>\n<parameter=x>\n[1]\n</parameter>\n</function>"
    assert get_parser("qwen3_coder").parse(text, tools=tools) == [ToolCall("run", {"x": [1]})]


def test_qwen3_coder_names_hermes_json_as_a_malformed_call():
    (call,) = get_parser("qwen3_coder").parse('<tool_call>{"name": "answer", "arguments": {}}</tool_call>')
    assert call.name == MALFORMED and "hermes format" in (call.error or "")


@pytest.mark.parametrize(
    ("fmt", "prose"),
    [
        ("llama3_json", 'The person is {"name": "Alice", "age": 3}.'),
        ("llama3_json", 'Use {"name": x} in code'),
        ("pythonic", "x = [int(v) for v in s.split()]"),
        ("pythonic", "use [len(x)] here"),
        ("pythonic", "[len(x)] is the length"),
        ("pythonic", "[int(v) for v in s]"),
    ],
)
def test_calls_written_inside_prose_or_code_are_no_calls(fmt, prose):
    assert get_parser(fmt).parse(prose, tools=SCHEMAS) == []


def test_llama3_json_reads_calls_that_open_a_line_and_follow_each_other():
    text = 'Here:\n{"name": "calculator", "parameters": {"expression": "12 * (3 + 4)"}};\n' + (
        '{"name": "answer", "parameters": {"value": "84"}} trailing words {"name": "x"}'
    )
    assert get_parser("llama3_json").parse(text) == [CALC, ANSWER]


@pytest.mark.parametrize("value", ["{1, 2}", "b'x'", "1j", "{1: 2}"])
def test_python_literals_without_a_json_form_are_malformed(value):
    (call,) = get_parser("pythonic").parse(f"[run(opts={value})]")
    assert call.name == MALFORMED and "not a literal" in (call.error or "")
    assert get_parser("pythonic").parse("[run(opts=(1, 2))]") == [ToolCall("run", {"opts": [1, 2]})]


@pytest.mark.parametrize("fmt", sorted(WELL_FORMED))
def test_calls_inside_reasoning_are_not_calls(fmt):
    """As SGLang and vLLM do with a reasoning parser: a call written while thinking never runs;
    the one after the reasoning does. The block opens the turn, or the template opened it in the
    prompt (``thinking``); a block never closed holds the whole turn; a ``<think>`` elsewhere (in a
    file the model writes) is text."""
    parser = get_parser(fmt)
    thought, call = parser.render([ANSWER]), parser.render([CALC])
    assert parser.parse(thought) == [ANSWER]  # each alone is a call: only where it stands differs
    assert parser.parse(f"<think>\nmaybe {thought}\n</think>\n\n{call}") == [CALC]
    assert parser.parse(f"\n<think>\nI will write {thought} and then") == []
    assert parser.parse(f"maybe {thought}\n</think>\n\n{call}", thinking=True) == [CALC]
    assert parser.parse(f"still thinking {thought}", thinking=True) == []
    assert parser.parse(f"{call}\nand <think> is how a thought begins") == [CALC]
    assert parser.thinking_after("<|im_start|>assistant\n<think>\n") and not parser.thinking_after(
        "assistant\n"
    )


def test_a_think_tag_in_a_calls_arguments_is_the_calls_text():
    parser = get_parser("hermes")
    write = ToolCall("write_file", {"path": "p.py", "content": "s = '<think>'\nt = '</think>'\n"})
    assert parser.parse(parser.render([write])) == [write]
