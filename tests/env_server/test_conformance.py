"""The conformance checker passes for every registered environment and names what a broken one breaks."""

from __future__ import annotations

import pytest

from env_server.conformance import ConformanceError, check_environment
from env_server.registry import register_environment, registry
from env_server.sessions import SessionManager
from tests.env_server.conftest import RUN_LABEL, wait_until_gone

HERE = "tests.env_server.envs"


@pytest.mark.parametrize("env_id", sorted(registry()))
async def test_every_registered_environment_conforms(env_id, docker_api):
    needs_sandbox = registry()[env_id].load().needs_sandbox
    manager = SessionManager(pool_size=0, run=RUN_LABEL)
    try:
        await check_environment(env_id, manager=manager)
        assert manager.live == 0, "the checker left sessions open"
    finally:
        await manager.shutdown()
    if needs_sandbox:
        assert await wait_until_gone(docker_api) == [], "the checked sessions' sandboxes were not removed"


def test_the_builtins_are_among_the_checked():
    assert {"echo-v1", "shell-v1"} <= set(registry())


@pytest.mark.parametrize(
    ("cls", "problem"),
    [
        (
            "BrokenAcceptsAnything",
            "invalid call to no_such_tool_xyz was answered as a success: 'fine'",
        ),
        ("BrokenAcceptsAnything", "invalid call to incr was answered as a success"),
        ("BrokenNondeterministic", "deterministic, but the same task and seed gave different observations"),
        ("BrokenDuplicateSchemas", "duplicate tool names ['incr', 'stop', 'incr']"),
        ("BrokenNeverEnds", "calling final tool stop did not end the episode"),
        ("BrokenSilentReset", "reset returned no messages"),
        ("BrokenGrader", "evaluate failed: RuntimeError: grader bug: nothing to count"),
    ],
)
async def test_a_broken_environment_is_named_with_its_problem(cls, problem, restore_registry):
    env_id = f"pytest-{cls.lower()}-v1"
    register_environment(env_id, f"{HERE}:{cls}")
    with pytest.raises(ConformanceError) as e:
        await check_environment(env_id)
    assert any(problem in p for p in e.value.problems), f"{problem!r} not in {e.value.problems}"
    assert str(e.value).startswith(f"{env_id} breaks the environment contract:")
