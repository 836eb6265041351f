"""Chat templates by choice: built-ins, files, errors that name the setting, and the system merge."""

from __future__ import annotations

import pytest

from loss_masking.chat_templates import BUILTIN_TEMPLATES, renderer_for, resolve_template
from pqrl.errors import UsageError
from pqrl.model_cache import load_tokenizer


def test_a_template_is_a_builtin_or_a_file(tmp_path):
    assert resolve_template("gemma") == BUILTIN_TEMPLATES["gemma"]
    (tmp_path / "t.jinja").write_text("{{ messages[0].content }}")
    assert resolve_template(str(tmp_path / "t.jinja")) == "{{ messages[0].content }}"
    with pytest.raises(UsageError, match="neither a built-in nor a file") as e:
        resolve_template(str(tmp_path / "missing.jinja"))
    assert e.value.exit_code == 2 and "chatml" in e.value.fix


def test_a_template_without_a_system_role_gets_the_system_text_in_the_first_user_turn(caplog):
    tok = load_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    with caplog.at_level("WARNING"):
        r = renderer_for(tok, chat_template="gemma")
    assert r.merges_system and sum("no system role" in m for m in caplog.messages) == 1
    text = r.decode(
        r.prompt([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}])
    )
    assert "<start_of_turn>user\nBe brief.\n\nHi?<end_of_turn>\n<start_of_turn>model\n" in text


def test_chatml_writes_structured_tool_calls_and_a_tools_block():
    r = renderer_for(load_tokenizer(), chat_template="chatml")
    assert r.supports_tools and r.renders_tool_calls and not r.merges_system
    call = {"type": "function", "function": {"name": "answer", "arguments": {"value": "84"}}}
    text = r.render(
        [{"role": "user", "content": "?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    )
    assert '<tool_call>\n{"name": "answer", "arguments": {"value": "84"}}\n</tool_call><|im_end|>' in text
