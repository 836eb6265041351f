"""Chat templates written for the tests: a Hermes/Qwen-style one with a tools block, and broken ones.

Written here from the shape of those templates (ChatML turns, a ``<tools>`` block in the system
message, ``<tool_call>`` JSON in assistant text, consecutive tool results grouped into one user turn
inside ``<tool_response>`` tags); not copied from any model repository. Also the tool schema and
call text the tests share.
"""

# An OpenAI-style tool schema and a Hermes-style call of it, as a model would write it.
CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
    },
}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expr": "6*7"}}</tool_call>'

HERMES = """
{%- if messages and messages[0].role == 'system' -%}
  {%- set system = messages[0].content -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system = 'You are a helpful assistant.' -%}
  {%- set rest = messages -%}
{%- endif -%}
{{- '<|im_start|>system\\n' + system -}}
{%- if tools -%}
  {{- '\\n\\n# Tools\\n\\nYou may call functions. Their signatures are inside <tools></tools>:\\n<tools>' -}}
  {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\\n</tools>\\n\\nFor each call, write <tool_call>{"name": <name>, "arguments": <args>}</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- for message in rest -%}
  {%- if message.role == 'tool' -%}
    {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}
    {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant\\n' + (message.content or '') -}}
    {%- for call in message.tool_calls or [] -%}
      {{- '<tool_call>' + ({'name': call.function.name, 'arguments': call.function.arguments} | tojson) -}}
      {{- '</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""

# ChatML that drops <think>...</think> from every assistant turn but the last one.
STRIPS_EARLIER_REASONING = """
{%- for message in messages -%}
  {%- set content = message.content -%}
  {%- if message.role == 'assistant' and not loop.last and '</think>' in content -%}
    {%- set content = content.split('</think>')[-1] -%}
  {%- endif -%}
  {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""

# ChatML whose generation prompt opens a reasoning block that rendered assistant turns do not have.
GENERATION_PROMPT_MISMATCH = """
{%- for message in messages -%}
  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}
"""

# ChatML that numbers turns from the end: every earlier message changes when one is appended.
COUNTS_FROM_END = """
{%- for message in messages -%}
  {{- '<|im_start|>' + message.role + ' ' + (messages | length - loop.index0) | string + '\\n' -}}
  {{- message.content + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""

# Plain-text turns separated by blank lines: the closing "\n\n" merges differently with the next
# role's text ("\n\n" + "tool" tokenizes as "\n", "\n", "tool"), so token deltas are unsafe.
MERGES_ACROSS_TURNS = """
{%- for message in messages -%}{{- message.role + ': ' + message.content + '\\n\\n' -}}{%- endfor -%}
{%- if add_generation_prompt -%}{{- 'assistant: ' -}}{%- endif -%}
"""

# ChatML that strips whitespace around every message: the probe passes, but a model that ends its
# text with spaces sees tokens the template would not render.
TRIMS_CONTENT = """
{%- for message in messages -%}
  {{- '<|im_start|>' + message.role + '\\n' + (message.content | trim) + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""

# Turns closed by <|endoftext|> alone, with no newline: the closing sequence is one token.
ENDOFTEXT_CLOSED = """
{%- for message in messages -%}
  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|endoftext|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""

# the call format a tool parser spells out for a system message (the hermes parser's)
HOW_TO_CALL = 'To call a tool, write exactly\n<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>'
