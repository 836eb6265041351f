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


@pytest.mark.parametrize(
    ("cls", "rule", "detail"),
    [
        ("BrokenCorrectEarnsNothing", "worked example earns 1", "the correct episode earned 0, not 1"),
        ("BrokenGenerous", "empty episode earns 0", "an episode without a call earned 1, not 0"),
    ],
)
async def test_the_worked_example_must_earn_the_full_reward_and_an_empty_episode_nothing(
    cls, rule, detail, restore_registry, capsys
):
    env_id = f"pytest-{cls.lower()}-v1"
    register_environment(env_id, f"{HERE}:{cls}", sample_task={"answer": "42"})
    report = await check_environment(env_id, raise_on_failure=False)
    failed = [r for r in report.rules if not r.passed]
    assert [(r.name, r.detail[: len(detail)]) for r in failed] == [(rule, detail)], failed
    assert len(report.rules) >= 12 and not report.ok


async def test_a_registered_worked_example_passes_and_every_rule_is_reported(restore_registry):
    register_environment(
        "pytest-strict-example-v1", f"{HERE}:StrictTaskEnv", sample_task={"answer": "42"},
        example_calls=[{"name": "guess", "arguments": {"value": "42"}}],
    )  # fmt: skip
    report = await check_environment("pytest-strict-example-v1")
    assert report.ok and report.env_id == "pytest-strict-example-v1"
    names = [r.name for r in report.rules]
    assert {"worked example earns 1", "empty episode earns 0", "invalid calls are not answered ok"} <= set(
        names
    )
    assert not any(r.skipped for r in report.rules)


def test_pqrl_env_check_prints_each_rule_and_fails_with_usage_status(restore_registry, capsys):
    from launcher.cli import main

    register_environment("pytest-stingy-v1", f"{HERE}:BrokenCorrectEarnsNothing", sample_task={"answer": "7"})
    assert main(["env", "check", "pytest-stingy-v1"]) == 2
    out, err = capsys.readouterr()
    assert "pass  invalid calls are not answered ok" in out
    assert "FAIL  worked example earns 1: the correct episode earned 0, not 1" in out
    assert "pytest-stingy-v1 fails 1 rule(s): worked example earns 1" in err and "Traceback" not in err
    assert main(["env", "check", "echo-v1"]) == 0
    assert "echo-v1: all 12 rules pass" in capsys.readouterr().out
    assert main(["env", "check", "nope-v1"]) == 2
    assert "unknown environment 'nope-v1'" in capsys.readouterr().err


async def test_an_environment_that_raises_is_a_failed_rule_not_a_crash(restore_registry):
    register_environment("pytest-brokenstep-v1", f"{HERE}:BrokenStep")
    report = await check_environment("pytest-brokenstep-v1", raise_on_failure=False)
    failed = {r.name: r.detail for r in report.rules if not r.passed}
    assert "step bug" in failed["episodes run without an environment error"], failed
    register_environment("pytest-badexample-v1", f"{HERE}:StrictTaskEnv", sample_task={"answer": "1"},
                         example_calls=[{"arguments": {}}])  # fmt: skip
    report = await check_environment("pytest-badexample-v1", raise_on_failure=False)
    failed = {r.name: r.detail for r in report.rules if not r.passed}
    assert failed["worked example earns 1"].startswith("the worked example could not be built: KeyError"), (
        failed
    )
