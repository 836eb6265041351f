"""Tiny random models of four architectures (built from a config: no download), each with SmolLM2's
vocabulary plus its family's special tokens and a chat template in its family's style, and a
scripted policy: a forward hook that forces the next token, so the real built-in engine generates
exactly the calls a test asks for in the family's tool-call format."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pqrl.model_cache import load_tokenizer

# Llama 3.1's layout: tools in the first user turn, calls as JSON with "parameters", results as ipython
LLAMA3 = (
    "<|begin_of_text|>{%- if messages[0].role == 'system' %}<|start_header_id|>system<|end_header_id|>\n\n"
    "{{ messages[0].content }}<|eot_id|>{%- set messages = messages[1:] %}{%- endif %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}<|start_header_id|>user<|end_header_id|>\n\n"
    "{%- if tools and loop.first %}Given the following functions, respond with a JSON function call."
    "{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n\n{%- endif %}{{ m.content }}<|eot_id|>"
    "{%- elif m.role == 'assistant' %}<|start_header_id|>assistant<|end_header_id|>\n\n{{ m.content }}"
    "{%- for tc in m.tool_calls or [] %}{{ '; ' if not loop.first }}"
    '{"name": "{{ tc.function.name }}", "parameters": {{ tc.function.arguments | tojson }}}{%- endfor %}'
    "<|eot_id|>{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}"
    "<|eot_id|>{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

# Mistral's layout: tools before the first instruction, calls after [TOOL_CALLS], results in
# [TOOL_RESULTS]; like Mistral's own templates, it refuses a call id or a result's that is not 9 long
MISTRAL = (
    "<s>{%- set ns = namespace(system='') %}{%- if messages[0].role == 'system' %}"
    "{%- set ns.system = messages[0].content + '\n\n' %}{%- set messages = messages[1:] %}{%- endif %}"
    "{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}[INST]{{ ns.system if loop.first }}{{ m.content }}"
    "[/INST]{%- elif m.role == 'assistant' %}{{ m.content }}{%- if m.tool_calls %}[TOOL_CALLS]["
    '{%- for tc in m.tool_calls %}{{ ", " if not loop.first }}'
    "{%- if tc.id is not defined or tc.id is not string or tc.id|length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}{%- endfor %}]'
    "{%- endif %}</s>{%- elif m.role == 'tool' %}"
    "{%- if m.tool_call_id is not defined or m.tool_call_id is not string or m.tool_call_id|length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    "[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]{%- endif %}"
    "{%- endfor %}"
)


@dataclass(frozen=True)
class Family:
    name: str
    architecture: str  # the transformers config class
    parser: str
    template: str  # a built-in's name or Jinja text
    special: tuple[str, ...]
    extra: tuple[tuple[str, Any], ...] = ()  # config fields of the architecture


FAMILIES = {
    f.name: f
    for f in (
        Family("llama", "LlamaConfig", "llama3_json", LLAMA3,
               ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|python_tag|>")),
        Family("qwen2", "Qwen2Config", "hermes", "chatml", ()),
        Family("mistral", "MistralConfig", "mistral", MISTRAL,
               ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                "[TOOL_RESULTS]", "[/TOOL_RESULTS]")),
        Family("gemma2", "Gemma2Config", "gemma", "gemma", ("<start_of_turn>", "<end_of_turn>"),
               (("head_dim", 8), ("sliding_window", 4096))),
        Family("qwen3", "Qwen3Config", "hermes", "qwen3", (), (("head_dim", 8),)),
    )
}  # fmt: skip


def tokenizer_for(family: Family) -> Any:
    tok = load_tokenizer()
    if family.special:
        tok.add_special_tokens({"additional_special_tokens": list(family.special)})
    return tok


def model_for(family: Family, vocab_size: int) -> Any:
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, family.architecture)(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, **dict(family.extra),
    )  # fmt: skip
    return transformers.AutoModelForCausalLM.from_config(config).eval()


class Script:
    """Forces the model's next token: turn k writes ``turns[k]`` (token ids), whatever the weights.

    A prefill (more than one new token) starts the next turn; each decode step writes the turn's
    next token. One sequence at a time, as one episode's turns are.
    """

    def __init__(self, model: Any, turns: Sequence[Sequence[int]]) -> None:
        self.turns, self.turn, self.start = [list(t) for t in turns], -1, 0
        self.handle = model.register_forward_hook(self._force, with_kwargs=True)

    def _force(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> Any:
        ids, pos = kwargs["input_ids"], kwargs["position_ids"]
        last = int(pos[0, -1])
        if ids.shape[1] > 1:
            self.turn, self.start = self.turn + 1, last + 1
        script = self.turns[min(self.turn, len(self.turns) - 1)]
        step = min(last + 1 - self.start, len(script) - 1)
        logits = torch.full_like(output.logits[:, -1, :], -1e9)
        logits[:, script[step]] = 0.0
        output.logits[:, -1, :] = logits
        return output

    def close(self) -> None:
        self.handle.remove()
