"""Open task kinds: an environment's task model is what a suite of its kind validates against,
looked up through the registry the same way for plug-ins and built-ins."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from pydantic import BaseModel, model_validator

from env_server import Message, RewardResult, ToolEnvironment, tool
from env_server import registry as registry_module
from env_server.registry import register_environment, spec
from tasks.suite import OpenTask, SuiteInvalid, parse_suite

HERE = "tests.tasks.test_plugin_kinds"


class UnitTask(BaseModel):
    kind: Literal["unit"] = "unit"
    id: str
    value: float
    unit: Literal["m", "km"]


class OtherTask(BaseModel):
    kind: Literal["other"] = "other"
    id: str


class NoKind(BaseModel):
    id: str


class UnitEnv(ToolEnvironment):
    task_model = UnitTask

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Any:
        return self.observation([Message(role="user", content="?")])

    @tool(final=True)
    async def submit(self, value: float) -> str:
        """Submits.

        Args:
            value: the number.
        """
        return "ok"

    async def evaluate(self) -> RewardResult:
        return RewardResult(reward=0.0)


class FreeEnv(UnitEnv):
    task_model = None

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__(scale=scale)


@pytest.fixture
def restore_registry():
    registry_module.load_plugins()
    saved = dict(registry_module._REGISTRY)
    yield
    registry_module._REGISTRY.clear()
    registry_module._REGISTRY.update(saved)


def _suite(env_id: str, kind: str, *tasks: dict[str, Any], defaults: dict[str, Any] | None = None) -> str:
    manifest = {
        "suite": {"name": "u", "version": "1", "env_id": env_id, "kind": kind, "defaults": defaults or {}}
    }
    return "\n".join(json.dumps(r) for r in (manifest, *tasks)) + "\n"


def test_a_plugin_kind_validates_against_its_model_with_line_and_field_problems(restore_registry):
    register_environment("pytest-unit-v1", f"{HERE}:UnitEnv")
    good = {"id": "u1", "kind": "unit", "value": 3, "unit": "km"}
    suite = parse_suite(_suite("pytest-unit-v1", "unit", good))
    assert isinstance(suite.tasks[0], UnitTask) and suite.manifest.reward == "env"
    with pytest.raises(SuiteInvalid) as err:
        parse_suite(
            _suite(
                "pytest-unit-v1",
                "unit",
                good,
                {"id": "u2", "kind": "unit", "value": "x", "unit": "mi"},
                {"id": "u3", "kind": "calc", "question": "?", "answer": "1"},
                {"id": "u4", "kind": "unit"},
            )
        )
    found = {(p.line, p.task_id, p.field) for p in err.value.problems}
    assert found == {
        (3, "u2", "value"),
        (3, "u2", "unit"),
        (4, "u3", "kind"),
        (5, "u4", "value"),
        (5, "u4", "unit"),
    }
    with pytest.raises(SuiteInvalid) as err:
        parse_suite(_suite("pytest-unit-v1", "calc", good))
    assert "pytest-unit-v1 runs tasks of kind 'unit', not 'calc'" in str(err.value)


def test_the_registration_model_wins_and_may_be_a_reference(restore_registry):
    register_environment("pytest-unit-v1", f"{HERE}:UnitEnv", task_model=f"{HERE}:OtherTask")
    assert spec("pytest-unit-v1").load_task_model() is OtherTask
    assert parse_suite(_suite("pytest-unit-v1", "other", {"id": "o1", "kind": "other"})).tasks[0].id == "o1"


def test_a_model_without_id_and_kind_is_refused_when_registered(restore_registry):
    with pytest.raises(TypeError, match="needs an 'id' field and a 'kind' field"):
        register_environment("pytest-nokind-v1", f"{HERE}:UnitEnv", task_model=NoKind)
    with pytest.raises(TypeError, match="not a pydantic model"):
        register_environment("pytest-nokind-v1", f"{HERE}:UnitEnv", task_model=dict)


def test_an_environment_without_a_model_takes_open_tasks_and_checks_its_init_arguments(restore_registry):
    register_environment("pytest-free-v1", f"{HERE}:FreeEnv")
    suite = parse_suite(_suite("pytest-free-v1", "anything", {"id": "f1", "kind": "anything", "prompt": "hi"},
                               defaults={"scale": 2}))  # fmt: skip
    assert isinstance(suite.tasks[0], OpenTask) and suite.tasks[0].model_dump()["prompt"] == "hi"
    with pytest.raises(SuiteInvalid) as err:
        parse_suite(
            _suite("pytest-free-v1", "anything", {"id": "Bad Id", "kind": "anything"}, defaults={"scal": 2})
        )
    found = {(p.line, p.field): p.reason for p in err.value.problems}
    assert "takes no argument 'scal'; it takes: scale" in found[(1, "suite.defaults.scal")]
    assert (2, "id") in found


class PickyTask(UnitTask):
    @model_validator(mode="after")
    def _picky(self) -> PickyTask:
        if self.value < 0:
            raise TypeError("a plug-in validator that raises TypeError")
        return self


class PickyEnv(UnitEnv):
    task_model = PickyTask


def test_a_plugin_that_cannot_load_or_validate_is_a_problem_not_a_traceback(restore_registry):
    register_environment("pytest-missing-v1", "tests.tasks.no_such_module_xyz:Env")
    found = _found(_suite("pytest-missing-v1", "unit", {"id": "u1", "kind": "unit", "value": 1, "unit": "m"}))
    assert (
        "cannot load 'tests.tasks.no_such_module_xyz:Env': ModuleNotFoundError" in found[(1, "suite.env_id")]
    )
    register_environment("pytest-picky-v1", f"{HERE}:PickyEnv")
    found = _found(_suite("pytest-picky-v1", "unit", {"id": "u1", "kind": "unit", "value": -1, "unit": "m"}))
    assert found[(2, "(record)")] == "TypeError: a plug-in validator that raises TypeError"


@pytest.mark.parametrize(
    ("reward", "field", "reason"),
    [
        ("length_penalty", "suite.reward", "missing a required argument: 'limit'"),
        (
            ["env", {"fn": "length_penalty", "args": {"limit": 9, "cap": 1}}],
            "suite.reward.1.args",
            "unexpected keyword",
        ),
        (["env", {"fn": "tool_format", "weight": "heavy"}], "suite.reward", ""),
    ],
)
def test_reward_terms_whose_args_do_not_fit_are_problems(restore_registry, reward, field, reason):
    register_environment("pytest-unit-v1", f"{HERE}:UnitEnv")
    text = _suite("pytest-unit-v1", "unit", {"id": "u1", "kind": "unit", "value": 1, "unit": "m"})
    manifest = json.loads(text.splitlines()[0])
    manifest["suite"]["reward"] = reward
    found = _found(json.dumps(manifest) + "\n" + text.splitlines()[1] + "\n")
    assert any(f.startswith(field) and reason in r for (_, f), r in found.items()), found


def _found(text: str) -> dict[tuple[int, str], str]:
    with pytest.raises(SuiteInvalid) as err:
        parse_suite(text)
    return {(p.line, p.field): p.reason for p in err.value.problems}
