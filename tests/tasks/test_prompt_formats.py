"""No environment hard-codes a tool-call format: prompts and worked examples name tools and
arguments only; the agent loop writes calls in the format of the model's tool parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_loop.tool_parser import PARSERS

ROOT = Path(__file__).resolve().parents[2]
# what each built-in format writes around a call: none may appear in an environment's text
MARKERS = ("<tool_call>", "</tool_call>", "<function=", "<|python_tag|>", "[TOOL_CALLS]", "tool_code")


def _environment_sources() -> list[Path]:
    return sorted([*(ROOT / "tasks").rglob("*.py"), *(ROOT / "examples").rglob("*.py")])


def test_every_format_marker_is_checked():
    written = "".join(p.render([{"name": "f", "arguments": {"a": 1}}]) for p in PARSERS.values())
    assert all(m in written for m in MARKERS if m != "<|python_tag|>")


@pytest.mark.parametrize("path", _environment_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_environment_writes_a_call_format(path):
    text = path.read_text(encoding="utf-8")
    found = [m for m in MARKERS if m in text]
    assert not found, f"{path.relative_to(ROOT)} hard-codes a tool-call format: {found}"
