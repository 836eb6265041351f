"""Chat-template rendering for token-in, token-out rollouts (model output is never re-tokenized).

``ChatRenderer`` wraps a Hugging Face tokenizer and its chat template and gives the agent loop the
three token sequences it needs, all rendered by the template itself:

- ``prompt(messages, tools)``: the initial prompt, ending with the generation prompt.
- ``closing_ids``: what the template puts after an assistant message's content (``<|im_end|>\\n``
  for ChatML); derived from a render, never hard-coded.
- ``delta(messages)``: the tokens that append observation messages (tool results, user turns) and
  the next generation prompt after an assistant turn, taken as the suffix of a render of a FIXED
  base conversation plus the messages over the render of the base alone, so the same message always
  yields the same tokens whatever came before.

Every consistency check compares template renders with template renders (text with text, or the
tokenization of one render with the tokenization of another); engine tokens are never compared with
re-tokenized text, because sampling can produce a valid but non-canonical split. A template that
renders earlier turns differently once more turns follow (for example one that strips earlier
``<think>`` reasoning) raises ``TemplateRewritesHistory`` at construction, and ``check_history``
runs the same check over a real conversation; with ``history="as_generated"`` such a template is
used with every turn kept as generated (no probe; deltas cut after the base's assistant turn). A
template that refuses a system role gets the system text merged into the first user turn.

Deliberately left out: rendering assistant turns (the engine's tokens are the assistant turns;
structured ``tool_calls`` fields are never re-rendered), escaping special-token text that a tool
prints (an output containing ``<|im_end|>`` becomes that special token, as the template's own
tokenization would make it; the mask keeps it out of the loss), and caching of deltas.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

__all__ = [
    "ChatRenderer",
    "MessageDict",
    "TemplateError",
    "TemplateRewritesHistory",
    "describe_tools",
]

log = logging.getLogger(__name__)

# How a template that rewrites earlier turns is used: refused (``strict``), or each turn kept as the
# model generated it (``as_generated``: deltas are cut after the base's assistant turn, wherever the
# template puts it, so the episode's tokens are the engine's plus the observations' renders).
History = Literal["strict", "as_generated"]
HISTORY_FIX = (
    "set model.template_history: as_generated to keep every turn as the model generated it "
    "(training then sees exactly the tokens the model saw)"
)

# A chat message in the form chat templates take: a mapping with ``role`` and ``content`` (and
# ``name`` for tool results). ``env_server.Message.model_dump(exclude_none=True)`` gives one.
MessageDict = Mapping[str, Any]

# The fixed conversation every delta is computed against. It ends with an assistant message
# because observations always follow an assistant turn.
_BASE: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "base"},
    {"role": "user", "content": "base"},
    {"role": "assistant", "content": "base"},
)

# Exercises what history-rewriting templates touch: reasoning in assistant turns, consecutive tool
# results (grouped by Qwen-style templates), and new user queries after tool turns.
_PROBE: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "You are a probe."},
    {"role": "user", "content": "First question?"},
    {"role": "assistant", "content": "<think>first thought</think>First answer."},
    {"role": "tool", "content": "first result", "tool_call_id": "call00000"},  # ids 9 long: Mistral's
    {"role": "tool", "content": "second result", "tool_call_id": "call00001"},
    {"role": "assistant", "content": "<think>second thought</think>Second answer."},
    {"role": "user", "content": "Second question?"},
    {"role": "assistant", "content": "<think>third thought</think>Third answer."},
    {"role": "user", "content": "Third question?"},
    {"role": "assistant", "content": "Last answer."},
)

_PROBE_TOOL_NAME = "pqrl_probe_tool_c41f"
_PROBE_CALL = {"id": "call00000", "type": "function", "function": {"name": _PROBE_TOOL_NAME, "arguments": {}}}
_CLOSING_MARKER = "pqrl closing probe"


class TemplateError(ValueError):
    """The chat template cannot be used for token-in, token-out rollouts as it stands."""


class TemplateRewritesHistory(TemplateError):
    """The template renders earlier messages differently once later ones follow.

    Appending deltas to the engine's tokens would then diverge from what the template renders for
    the whole conversation; rather than silently re-tokenizing, the renderer refuses.
    """


def _first_difference(a: str, b: str) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"at character {i}: {a[max(0, i - 30) : i + 30]!r} vs {b[max(0, i - 30) : i + 30]!r}"


class ChatRenderer:
    """Token deltas, prompts and closing tokens from a tokenizer's chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        template_kwargs: extra variables for the template (e.g. ``enable_thinking``), passed to
            every render.
        base: the fixed conversation deltas are computed against; must end with an assistant
            message. The default is a three-message system/user/assistant exchange.
        verify: run the history-rewrite probe at construction (raises ``TemplateRewritesHistory``).
        history: ``strict`` refuses a template that rewrites earlier turns; ``as_generated`` keeps
            every turn as generated (deltas cut after the base's assistant turn, no probe).

    A template that refuses a system role gets the system text merged into the first user turn
    (``merges_system``; logged once per renderer).

    Raises:
        TemplateError: the template cannot render the base or probe conversations, or its pieces do
            not tokenize separately.
        TemplateRewritesHistory: the template rewrites earlier turns.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        template_kwargs: Mapping[str, Any] | None = None,
        base: Sequence[MessageDict] | None = None,
        verify: bool = True,
        history: History = "strict",
    ) -> None:
        self.tokenizer = tokenizer
        self._kwargs = dict(template_kwargs or {})
        self.history = history
        self._base = [dict(m) for m in (base if base is not None else _BASE)]
        if not self._base or self._base[-1].get("role") != "assistant":
            raise TemplateError("the base conversation must end with an assistant message")
        self.merges_system = self._refuses_system()
        try:
            self._base_text = self.render(self._base)
            self._base_ids = self.encode(self._base_text)
            self.closing_text, self.closing_ids = self._derive_closing()
            if verify and history == "strict":
                self.check_history(_PROBE)
        except TemplateRewritesHistory as e:
            raise TemplateRewritesHistory(f"{e}; {HISTORY_FIX}") from None
        self.supports_tools = self._detect_tools()
        self.renders_tool_calls = self.supports_tools and self._detect_tool_calls()

    # -- rendering -------------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[MessageDict],
        tools: Sequence[Any] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for ``messages`` (and ``tools``), optionally with the generation prompt."""
        msgs = [dict(m) for m in messages]
        if getattr(self, "merges_system", False):
            msgs = _merge_system(msgs)
        try:
            text = self.tokenizer.apply_chat_template(
                msgs,
                tools=list(tools) if tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **self._kwargs,
            )
        except Exception as e:  # jinja raises its own types; say which conversation failed
            roles = [m.get("role") for m in messages]
            raise TemplateError(f"the chat template cannot render roles {roles}: {e}") from e
        if not isinstance(text, str):
            raise TemplateError(f"apply_chat_template returned {type(text).__name__}, not str")
        return text

    def encode(self, text: str) -> list[int]:
        """Tokenizes template text; the template writes any BOS itself, so none is added."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept (for parsing tool calls and history checks)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def prompt(self, messages: Sequence[MessageDict], tools: Sequence[Any] | None = None) -> list[int]:
        """The initial prompt tokens, ending with the generation prompt.

        Args:
            messages: the conversation so far (system, user, maybe few-shot turns).
            tools: OpenAI-style tool schemas, rendered by the template's tools block.

        Raises:
            TemplateError: ``tools`` were given but the template has no tools block; put
                ``describe_tools(tools)`` into the system message instead.
        """
        if tools and not self.supports_tools:
            raise TemplateError(
                "this chat template has no tools block: pass tools=None and put describe_tools(tools) "
                "into the system message"
            )
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def delta(self, messages: Sequence[MessageDict], *, add_generation_prompt: bool = True) -> list[int]:
        """Tokens that append ``messages`` after a closed assistant turn.

        Computed as render(base + messages) minus render(base) for the fixed base conversation, so
        the result depends on the messages alone.

        Args:
            messages: the observation (tool results and/or user messages) to append.
            add_generation_prompt: end with the next assistant generation prompt.

        Raises:
            TemplateRewritesHistory: appending the messages changes how the base renders.
            TemplateError: the base's tokens are not a prefix of the longer render's tokens (the
                template joins them with text that merges across the boundary).
        """
        full_text = self._base_text + self._delta_text(messages, add_generation_prompt)
        full_ids = self.encode(full_text)
        n = len(self._base_ids)
        if self.history == "as_generated":  # the delta must tokenize apart from what precedes it
            delta_ids = self.encode(full_text[len(self._base_text) :])
            if full_ids != self._base_ids + delta_ids:
                raise TemplateError(
                    f"the observation's text {full_text[len(self._base_text) :]!r} does not tokenize "
                    "apart from the turn before it"
                )
            return delta_ids
        if full_ids[:n] != self._base_ids:
            raise TemplateError(
                "the base conversation's tokens are not a prefix of the tokens with the observation "
                "appended (a token merges across the boundary); delta text "
                f"{full_text[len(self._base_text) :]!r}"
            )
        return full_ids[n:]

    def split_closing(self, output_ids: Sequence[int]) -> tuple[int, list[int]]:
        """How much of the closing sequence the engine generated itself.

        Returns:
            ``(content_len, missing)``: ``output_ids[:content_len]`` is the message content and
            ``output_ids[content_len:]`` the part of the closing sequence the engine produced (its
            longest prefix that ends the output); ``missing`` is the rest, to be appended.
        """
        out = list(output_ids)
        closing = self.closing_ids
        for k in range(min(len(closing), len(out)), 0, -1):
            if out[len(out) - k :] == closing[:k]:
                return len(out) - k, closing[k:]
        return len(out), list(closing)

    # -- checks ----------------------------------------------------------------------------------

    def check_history(self, messages: Sequence[MessageDict], tools: Sequence[Any] | None = None) -> None:
        """Checks that token deltas reproduce the template's render of ``messages``.

        For every assistant message ``i`` (after the first message): the render up to ``i`` equals
        the render before it with the generation prompt, plus its content, plus the closing text;
        and the observation messages up to the next assistant message render as exactly their
        base-conversation delta. By induction the prompt, contents, closings and deltas concatenate
        to the render of the whole conversation. Renders are compared with renders only.

        Raises:
            TemplateRewritesHistory: naming the message where the renders disagree.
        """
        msgs = [dict(m) for m in messages]
        turns = [i for i, m in enumerate(msgs) if m.get("role") == "assistant" and i > 0]
        for n, i in enumerate(turns):
            content = msgs[i].get("content")
            if not isinstance(content, str):
                raise TemplateError(f"message {i}: assistant content must be the generated text")
            before = self.render(msgs[:i], tools, add_generation_prompt=True)
            upto = self.render(msgs[: i + 1], tools)
            expected = before + content + self.closing_text
            if upto != expected:
                raise TemplateRewritesHistory(
                    f"message {i} (assistant) does not render as generation prompt + content + closing; "
                    + _first_difference(upto, expected)
                )
            j = turns[n + 1] if n + 1 < len(turns) else len(msgs)
            if j == i + 1:
                continue
            after = self.render(msgs[:j], tools, add_generation_prompt=True)
            if not after.startswith(upto):
                raise TemplateRewritesHistory(
                    f"appending messages {i + 1}..{j - 1} changes how messages 0..{i} render; "
                    + _first_difference(after, upto)
                )
            in_context = after[len(upto) :]
            fixed = self._delta_text(msgs[i + 1 : j], True)
            if in_context != fixed:
                raise TemplateRewritesHistory(
                    f"messages {i + 1}..{j - 1} render differently after this history than after the "
                    "base conversation; " + _first_difference(in_context, fixed)
                )

    # -- internals -------------------------------------------------------------------------------

    def _delta_text(self, messages: Sequence[MessageDict], add_generation_prompt: bool) -> str:
        full = self.render([*self._base, *messages], add_generation_prompt=add_generation_prompt)
        if self.history == "as_generated":
            return full[self._end_of_base(full) :]
        if not full.startswith(self._base_text):
            raise TemplateRewritesHistory(
                "appending messages changes how the base conversation renders; "
                + _first_difference(full, self._base_text)
            )
        return full[len(self._base_text) :]

    def _derive_closing(self) -> tuple[str, list[int]]:
        """The text after an assistant message's content, and its tokens (checked to stand alone)."""
        head = self._base[:-1]
        gen = self.render(head, add_generation_prompt=True)
        full = self.render([*head, {"role": "assistant", "content": _CLOSING_MARKER}])
        if self.history == "as_generated":  # the template may add to the turn; what follows is the closing
            at = full.rfind(_CLOSING_MARKER)
            if at < 0:
                raise TemplateError("an assistant message's content does not appear in its render")
            gen = full[:at]
        if not full.startswith(gen + _CLOSING_MARKER):
            raise TemplateRewritesHistory(
                "an assistant message does not render as the generation prompt followed by its content; "
                + _first_difference(full, gen + _CLOSING_MARKER)
            )
        text = full[len(gen) + len(_CLOSING_MARKER) :]
        ids = self.encode(text)
        if text and self.encode(full) != self.encode(full[: -len(text)]) + ids:
            raise TemplateError(f"the closing text {text!r} does not tokenize apart from the content")
        return text, ids

    def _end_of_base(self, full: str) -> int:
        """Where the base conversation's assistant turn (its content and closing) ends in ``full``:
        the turns before it must render unchanged; the turn itself may be rewritten."""
        head = self.render(self._base[:-1])
        anchor = str(self._base[-1].get("content", "")) + self.closing_text
        at = full.find(anchor, len(head)) if full.startswith(head) else -1
        if at < 0:
            raise TemplateError("the base conversation's last turn cannot be found in a longer render")
        return at + len(anchor)

    def _refuses_system(self) -> bool:
        """A template that raises for a system role but renders the same turn without one."""
        user = {"role": "user", "content": "probe"}
        try:
            self.render([{"role": "system", "content": "probe"}, user])
            return False
        except TemplateError as e:
            try:
                self.render([user])
            except TemplateError:
                return False
            log.warning("the chat template has no system role (%s): its text joins the first user turn", e)
            return True

    def _detect_tool_calls(self) -> bool:
        """Whether the template writes an assistant message's structured ``tool_calls``."""
        msgs = [{"role": "user", "content": "probe"},
                {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}]  # fmt: skip
        try:
            return _PROBE_TOOL_NAME in self.render(msgs)
        except TemplateError:
            return False

    def _detect_tools(self) -> bool:
        tool = {
            "type": "function",
            "function": {"name": _PROBE_TOOL_NAME, "description": "probe", "parameters": {"type": "object"}},
        }
        try:
            text = self.render([{"role": "user", "content": "probe"}], [tool])
        except TemplateError:
            return False
        return _PROBE_TOOL_NAME in text


def describe_tools(tools: Sequence[Mapping[str, Any]], how_to_call: str) -> str:
    """Tool instructions for a system message, for templates without a tools block.

    Args:
        tools: OpenAI-style tool schemas (``{"type": "function", "function": {...}}``).
        how_to_call: the call format, as the tool parser spells it.

    Returns:
        Text listing the schemas inside ``<tools></tools>``, then ``how_to_call``.
    """
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "You can call tools. Their JSON schemas are listed inside <tools></tools>:\n"
        f"<tools>\n{lines}\n</tools>\n{how_to_call}"
    )


def _merge_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading system messages' text put at the start of the first user turn."""
    system = [m for m in messages if m.get("role") == "system"]
    if not system:
        return messages
    rest = [m for m in messages if m.get("role") != "system"]
    text = "\n\n".join(str(m.get("content", "")) for m in system)
    for i, m in enumerate(rest):
        if m.get("role") == "user":
            return [*rest[:i], {**m, "content": f"{text}\n\n{m.get('content', '')}"}, *rest[i + 1 :]]
    return [{"role": "user", "content": text}, *rest]
