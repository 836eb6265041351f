"""Chat templates by choice: a model's own, a Jinja file, or a named built-in, with its kwargs.

``model.chat_template`` names one (``None``: the tokenizer's own); ``model.template_kwargs`` are
passed to every render (``enable_thinking`` for Qwen3-style templates). Built-ins, for models
whose tokenizer ships none or a template unfit for tool use:

- ``chatml``: ChatML with a Hermes tools block and ``tool_calls`` written as ``<tool_call>`` JSON;
- ``gemma``: Gemma's turns (``model`` for the assistant), no system role (its text goes into the
  first user turn), tool results as user turns;
- ``qwen3``: ChatML with thinking (``enable_thinking``), earlier turns' reasoning stripped as
  Qwen3 strips it: a template that rewrites history (``model.template_history``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loss_masking.template import ChatRenderer, History
from pqrl.errors import UsageError

__all__ = ["BUILTIN_TEMPLATES", "load_renderer", "renderer_for", "resolve_template"]

_TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)
_SYSTEM = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}"
    "\n\n{% endif %}" + _TOOLS_BLOCK + "<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
)
_CALLS = (
    "{%- for tc in m.tool_calls or [] %}{% if content or not loop.first %}\n{% endif %}<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}'
    "\n</tool_call>{%- endfor %}"
)
_TOOL_RESULT = (
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
)

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": _SYSTEM
    + "{%- for m in messages %}{% if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- elif m.role == 'assistant' %}{% set content = m.content %}<|im_start|>assistant\n{{ content }}"
    + _CALLS
    + "<|im_end|>\n{%- elif m.role == 'tool' %}"
    + _TOOL_RESULT
    + "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "gemma": "{{ bos_token }}{%- if messages[0].role == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{%- for m in messages %}{% set role = 'model' if m.role == 'assistant' else 'user' %}"
    "<start_of_turn>{{ role }}\n{% if m.role == 'tool' %}```tool_output\n{{ m.content | trim }}\n```"
    "{% else %}{{ m.content | trim }}{% endif %}<end_of_turn>\n{% endfor %}"
    "{%- if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
    "qwen3": _SYSTEM
    + "{%- set ns = namespace(last_query=-1) %}{%- for m in messages %}{% if m.role == 'user' %}"
    "{% set ns.last_query = loop.index0 %}{% endif %}{% endfor %}"
    "{%- for m in messages %}{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n"
    "{%- elif m.role == 'assistant' %}{% set content = m.content %}{% set reasoning = '' %}"
    "{%- if '</think>' in content %}{% set reasoning = content.split('</think>')[0].split('<think>')[-1]"
    ".strip('\n') %}{% set content = content.split('</think>')[-1].lstrip('\n') %}{% endif %}"
    "<|im_start|>assistant\n{% if loop.index0 > ns.last_query and (loop.last or reasoning) %}"
    "<think>\n{{ reasoning }}\n</think>\n\n{% endif %}{{ content }}"
    + _CALLS
    + "<|im_end|>\n{%- elif m.role == 'tool' %}"
    + _TOOL_RESULT
    + "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}",
}


def resolve_template(spec: str) -> str:
    """The Jinja text of ``spec``: a built-in's name or a template file (UsageError otherwise)."""
    if spec in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[spec]
    path = Path(spec).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):  # not a file, unreadable, a name too long to be one
        pass
    raise UsageError(
        f"chat template {spec!r} is neither a built-in nor a file",
        fix=f"set model.chat_template to a Jinja file or one of {', '.join(sorted(BUILTIN_TEMPLATES))}",
    )


def load_renderer(model: str, **options: Any) -> ChatRenderer:
    """The renderer of ``model``'s tokenizer (a built-in name, a directory or a cached Hub id);
    ``options`` as ``renderer_for`` takes them."""
    from pqrl.model_cache import load_tokenizer

    return renderer_for(load_tokenizer(model), **options)


def renderer_for(
    tokenizer: Any,
    *,
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    history: History = "strict",
) -> ChatRenderer:
    """A ``ChatRenderer`` over ``tokenizer`` with the chosen template and kwargs."""
    if chat_template is not None:
        tokenizer.chat_template = resolve_template(chat_template)
    elif not getattr(tokenizer, "chat_template", None):
        raise UsageError(
            "the model's tokenizer has no chat template",
            fix=f"set model.chat_template to a Jinja file or one of {', '.join(sorted(BUILTIN_TEMPLATES))}",
        )
    return ChatRenderer(tokenizer, template_kwargs=template_kwargs, history=history)
