"""Wrappers (TurnLimit, ToolTimeout, ObservationCap) and the registry (ids, entry points, plug-ins)."""

from __future__ import annotations

import logging
import time
from importlib.metadata import EntryPoint, entry_points

import pytest

from env_server import registry as registry_module
from env_server.builtin import EchoEnv
from env_server.registry import (
    ENTRY_POINT_GROUP,
    UnknownEnvironment,
    load_plugins,
    make,
    register_environment,
    registry,
    spec,
)
from env_server.types import Message, ToolCall, ToolStatus
from env_server.wrappers import ObservationCap, ToolTimeout, TurnLimit
from tests.env_server.envs import COUNTER_TURNS, LONG_CAP, SLOW_TIMEOUT_S, CounterEnv, LongEnv, SlowEnv


def call(name: str, id: str | None = None, **arguments) -> ToolCall:
    return ToolCall(name=name, arguments=arguments, id=id)


# ---------------------------------------------------------------- TurnLimit


async def test_turn_limit_ends_the_episode_after_n_steps():
    env = TurnLimit(CounterEnv(), max_turns=3)
    await env.reset(task={})
    results = [await env.step([call("incr")]) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info == {"truncated": "turn_limit"}
    assert "truncated" not in results[0].info
    assert env.unwrapped.done, "the inner environment must know the episode is over"
    assert env.unwrapped.count == 3


async def test_turn_limit_does_not_mark_a_natural_end_as_truncated():
    env = TurnLimit(CounterEnv(), max_turns=2)
    await env.reset(task={})
    await env.step([call("incr")])
    last = await env.step([call("stop")])
    assert last.done and "truncated" not in last.info


async def test_turn_limit_resets_its_count():
    env = TurnLimit(CounterEnv(), max_turns=2)
    await env.reset(task={})
    await env.step([call("incr")])
    await env.reset(task={})
    assert not (await env.step([call("incr")])).done, "reset must restart the turn count"


def test_wrapper_arguments_are_checked():
    with pytest.raises(ValueError, match="max_turns"):
        TurnLimit(CounterEnv(), 0)
    with pytest.raises(ValueError, match="seconds"):
        ToolTimeout(CounterEnv(), 0)
    with pytest.raises(ValueError, match="max_chars"):
        ObservationCap(CounterEnv(), 63)


# ---------------------------------------------------------------- ToolTimeout


async def test_tool_timeout_turns_a_slow_call_into_an_error_and_runs_the_others():
    env = ToolTimeout(SlowEnv(), seconds=0.1)
    await env.reset(task={})
    t0 = time.monotonic()
    result = await env.step([call("quick", "a"), call("nap", "b", seconds=5), call("quick", "c")])
    elapsed = time.monotonic() - t0
    assert elapsed < 2, f"the slow call was not cut ({elapsed:.1f}s)"
    assert [m.tool_call_id for m in result.messages] == ["a", "b", "c"]
    assert [m.content for m in result.messages] == ["quick", "Error: nap timed out after 0.1s", "quick"]
    assert result.messages[1].role == "tool" and result.messages[1].name == "nap"
    assert [m.status for m in result.messages] == [ToolStatus.OK, ToolStatus.TIMEOUT, ToolStatus.OK]
    assert not result.done


async def test_tool_timeout_lets_fast_enough_calls_finish():
    env = ToolTimeout(SlowEnv(), seconds=2)
    await env.reset(task={})
    result = await env.step([call("nap", seconds=0.01), call("finish")])
    assert [m.content for m in result.messages] == ["slept 0.01s", "finished"]
    assert result.done


async def test_every_call_gets_a_tool_message_even_after_a_final_tool():
    env = make("pytest-slow-v1")
    await env.reset(task={})
    result = await env.step([call("finish", "a"), call("quick", "b")])
    assert result.done
    assert [m.tool_call_id for m in result.messages] == ["a", "b"], "one tool message per call"


async def test_made_environment_applies_the_spec_timeout():
    env = make("pytest-slow-v1")
    await env.reset(task={})
    result = await env.step([call("nap", seconds=10)])
    assert result.messages[0].content == f"Error: nap timed out after {SLOW_TIMEOUT_S:g}s"


# ---------------------------------------------------------------- ObservationCap


async def test_observation_cap_cuts_long_messages_with_a_note():
    env = ObservationCap(LongEnv(), max_chars=64)
    await env.reset(task={})
    result = await env.step([call("shout", "a", n=100), call("shout", "b", n=64)])
    cut, exact = result.messages
    assert cut.content == "x" * 64 + "\n[output truncated: 36 more characters]"
    assert cut.tool_call_id == "a" and cut.name == "shout"
    assert exact.content == "x" * 64, "a message of exactly max_chars is kept whole"


async def test_observation_cap_applies_to_the_first_observation():
    env = ObservationCap(LongEnv(), max_chars=64)
    obs = await env.reset(task={"prompt": "p" * 70})
    assert obs.messages == [
        Message(role="user", content="p" * 64 + "\n[output truncated: 6 more characters]")
    ]


async def test_make_stacks_the_spec_limits():
    env = make("pytest-long-v1")
    assert isinstance(env, ObservationCap) and env.max_chars == LONG_CAP
    assert isinstance(env.env, TurnLimit) and isinstance(env.env.env, ToolTimeout)
    assert isinstance(env.unwrapped, LongEnv)
    await env.reset(task={})
    result = await env.step([call("shout", n=LONG_CAP + 5)])
    assert result.messages[0].content.endswith("[output truncated: 5 more characters]")
    counter = make("pytest-counter-v1")
    assert counter.env.max_turns == COUNTER_TURNS
    assert counter.tools is CounterEnv.tools, "wrappers delegate attributes to the environment"


# ---------------------------------------------------------------- registry


@pytest.mark.parametrize("bad", ["echo", "echo-1", "echo v1", "1echo-v1", "echo-v1 ", "-v1", "echo-vx"])
def test_register_rejects_bad_ids(bad, restore_registry):
    with pytest.raises(ValueError, match="must look like 'name-v1'"):
        register_environment(bad, "env_server.builtin:EchoEnv")


def test_register_rejects_entry_points_without_a_class(restore_registry):
    with pytest.raises(ValueError, match="package.module:ClassName"):
        register_environment("pytest-noclass-v1", "env_server.builtin.EchoEnv")


def test_reregistering_the_same_spec_is_fine_and_a_different_one_is_an_error(restore_registry):
    first = register_environment("pytest-twice-v1", "env_server.builtin:EchoEnv", max_turns=3, greeting="hi")
    again = register_environment("pytest-twice-v1", "env_server.builtin:EchoEnv", max_turns=3, greeting="hi")
    assert first == again and spec("pytest-twice-v1") == first
    with pytest.raises(ValueError, match="already registered with a different spec"):
        register_environment("pytest-twice-v1", "env_server.builtin:EchoEnv", max_turns=4, greeting="hi")
    with pytest.raises(ValueError, match="already registered with a different spec"):
        register_environment("pytest-twice-v1", "env_server.builtin:EchoEnv", max_turns=3, greeting="hey")
    assert spec("pytest-twice-v1") == first, "a refused registration must not replace the spec"


def test_make_passes_kwargs_and_overrides_as_config(restore_registry):
    register_environment("pytest-config-v1", "env_server.builtin:EchoEnv", greeting="hi", level=1)
    env = make("pytest-config-v1", level=2)
    assert env.unwrapped.config == {"greeting": "hi", "level": 2}


def test_make_of_an_unknown_id_lists_the_registered_ones():
    with pytest.raises(UnknownEnvironment) as e:
        make("nope-v1")
    assert isinstance(e.value, KeyError) and e.value.env_id == "nope-v1"
    text = str(e.value)
    assert text.startswith("unknown environment 'nope-v1'; registered: ")
    for env_id in ("echo-v1", "shell-v1", "pytest-slow-v1"):
        assert env_id in text, text


@pytest.mark.parametrize(
    ("entry_point", "error", "says"),
    [
        ("tests.env_server.no_such_module_xyz:Env", ImportError, "No module named"),
        ("env_server.builtin:NoSuchEnv", ImportError, "NoSuchEnv"),
        ("env_server.builtin:register", TypeError, "is not a ToolEnvironment subclass"),
    ],
)
def test_bad_entry_points_name_themselves(entry_point, error, says, restore_registry):
    register_environment("pytest-badentry-v1", entry_point)
    with pytest.raises(error) as e:
        make("pytest-badentry-v1")
    text = str(e.value)
    assert "pytest-badentry-v1" in text and repr(entry_point) in text and says in text, text


def test_builtin_entry_point_is_installed():
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert found.get("builtin") == "env_server.builtin:register", found


def test_registry_holds_the_builtins_and_the_test_environments():
    ids = set(registry())
    assert {"echo-v1", "shell-v1", "pytest-slow-v1", "pytest-long-v1", "pytest-counter-v1"} <= ids
    assert spec("echo-v1").load() is EchoEnv


def test_load_plugins_survives_a_broken_plugin(monkeypatch, restore_registry, caplog):
    good = EntryPoint(
        "good", "tests.env_server.test_wrappers_registry:_register_plugin_env", ENTRY_POINT_GROUP
    )
    broken = EntryPoint("broken", "tests.env_server.no_such_plugin_xyz:register", ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry_module, "entry_points", lambda group: [broken, good])
    monkeypatch.setattr(registry_module, "_plugins_loaded", False)
    with caplog.at_level(logging.ERROR, logger="env_server.registry"):
        load_plugins()
    assert "pytest-plugin-v1" in registry(), "a broken plug-in hid a good one"
    assert any("broken" in r.getMessage() and "no_such_plugin_xyz" in r.getMessage() for r in caplog.records)
    calls = len(_plugin_calls)
    load_plugins()
    assert len(_plugin_calls) == calls, "plug-ins run once"


_plugin_calls: list[int] = []


def _register_plugin_env() -> None:
    _plugin_calls.append(1)
    register_environment("pytest-plugin-v1", "env_server.builtin:EchoEnv")
