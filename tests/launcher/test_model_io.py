"""The model section's conversation settings: validated when the config is read, passed to the
episodes and to the renderer, shared by every process of a run; and the commands' flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agent_loop.config import EpisodeConfig
from agent_loop.tool_parser import UnknownToolParser
from launcher.jobconfig import ConfigInvalid, episode_config, load_config, shared_settings
from launcher.model_io import add_template_arguments, renderer_from_args, renderer_of
from pqrl.errors import UsageError

BASE = "run: x\ntasks:\n  suites: [{generate: calc}]\n"


def _config(tmp_path: Path, model: str):
    path = tmp_path / "job.yaml"
    path.write_text(BASE + model)
    return load_config(path)


def test_the_tool_parser_reaches_the_episodes_and_every_process_agrees_on_it(tmp_path):
    cfg = _config(tmp_path, "model:\n  tool_parser: mistral\n  template_kwargs: {enable_thinking: false}\n")
    assert episode_config(cfg).tool_parser == "mistral"
    shared = shared_settings(cfg)["model_io"]
    assert shared["tool_parser"] == "mistral" and shared["template_kwargs"] == {"enable_thinking": False}
    assert shared_settings(_config(tmp_path, ""))["model_io"] != shared  # a worker that differs is refused


def test_an_unknown_parser_or_a_parser_in_the_rollout_section_is_a_config_error(tmp_path):
    with pytest.raises(
        ConfigInvalid, match=r"model.tool_parser: .*unknown tool parser 'hermes2'.*qwen3_coder"
    ):
        _config(tmp_path, "model:\n  tool_parser: hermes2\n")
    with pytest.raises(ConfigInvalid, match="rollout.tool_parser"):
        _config(tmp_path, "rollout:\n  tool_parser: mistral\n")
    with pytest.raises(UnknownToolParser):  # built in code, it fails where it is written too
        EpisodeConfig(tool_parser="nope")


def test_the_renderer_follows_the_model_section(tmp_path):
    r = renderer_of(_config(tmp_path, "model:\n  chat_template: gemma\n").model)
    assert r.merges_system and r.closing_text == "<end_of_turn>\n"
    with pytest.raises(ConfigInvalid, match="model.chat_template: .*neither a built-in nor a file"):
        _config(tmp_path, "model:\n  chat_template: nope.jinja\n")
    with pytest.raises(UsageError, match="model.template_history: as_generated"):
        renderer_of(_config(tmp_path, "model:\n  chat_template: qwen3\n").model)
    r = renderer_of(
        _config(tmp_path, "model:\n  chat_template: qwen3\n  template_history: as_generated\n").model
    )
    assert r.history == "as_generated"


def test_flags_choose_the_template_and_a_runs_section_fills_the_rest(tmp_path):
    p = argparse.ArgumentParser()
    add_template_arguments(p)
    run_model = _config(tmp_path, "model:\n  chat_template: qwen3\n  template_history: as_generated\n").model
    r = renderer_from_args(p.parse_args([]), "smollm2-135m-instruct", run_model)
    assert r.history == "as_generated" and "<think>" in r.tokenizer.chat_template
    args = p.parse_args(["--chat-template", "chatml", "--template-kwargs", '{"enable_thinking": false}'])
    assert renderer_from_args(args, "smollm2-135m-instruct").renders_tool_calls
    with pytest.raises(SystemExit):
        p.parse_args(["--template-kwargs", "[1]"])
