"""What a suite's manifest asks of its environment, checked against the registry: the environment
exists and loads, the suite's kind is the one its task model declares, ``defaults`` are arguments it
takes, and ``reward`` names functions that exist. Each finding is a (field, reason) pair; nothing
here raises for a bad suite."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from env_server.environment import ToolEnvironment
from env_server.registry import EnvSpec, UnknownEnvironment, registry, spec, task_kind
from tasks.rewards import RewardSpec, resolve_function, terms

__all__ = ["EnvCheck", "check_environment_of", "config_problems", "field_path", "reward_problems"]

Finding = tuple[str, str]


@dataclass
class EnvCheck:
    """The task model a suite's tasks validate against (None: the environment declares none, or
    could not be found) and what is wrong with the manifest."""

    task_model: type[BaseModel] | None
    findings: list[Finding]


def field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc)


def check_environment_of(env_id: str, kind: str, defaults: dict[str, Any], reward: RewardSpec) -> EnvCheck:
    try:
        s = spec(env_id)
    except UnknownEnvironment:
        known = ", ".join(sorted(registry())) or "none"
        model = _model_of_kind(kind)
        return EnvCheck(model, [("env_id", f"unknown environment {env_id!r}; registered: {known}")])
    try:
        cls = s.load()
        model = s.load_task_model()
    except (ImportError, TypeError) as e:
        return EnvCheck(None, [("env_id", str(e))])
    findings: list[Finding] = []
    if model is not None and task_kind(model) != kind:
        findings.append(("kind", f"{env_id} runs tasks of kind {task_kind(model)!r}, not {kind!r}"))
        model = _model_of_kind(kind)  # the tasks are still checked as what they say they are
    findings += config_problems(cls, s, defaults)
    findings += reward_problems(reward, cls.reward_names)
    return EnvCheck(model, findings)


def config_problems(cls: type[ToolEnvironment], s: EnvSpec, defaults: dict[str, Any]) -> list[Finding]:
    """``defaults`` over the registered arguments, against the class's ``config_model``, or, without
    one, against the names its ``__init__`` takes."""
    merged = {**s.kwargs, **defaults}
    if cls.config_model is not None:
        try:
            cls.config_model.model_validate(merged)
        except ValidationError as e:
            return [("defaults." + field_path(err["loc"]) if err["loc"] else "defaults", err["msg"])
                    for err in e.errors()]  # fmt: skip
        except Exception as e:  # a validator of the plug-in's that raised something else
            return [("defaults", f"{cls.config_model.__name__} failed: {type(e).__name__}: {e}")]
        return []
    try:
        params = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return []  # takes any keyword: nothing to check against
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)} - {"self"}
    return [
        (f"defaults.{k}", f"{s.id} takes no argument {k!r}; it takes: {', '.join(sorted(names)) or 'none'}")
        for k in defaults
        if k not in names
    ]


def reward_problems(reward: RewardSpec, env_names: tuple[str, ...]) -> list[Finding]:
    out: list[Finding] = []
    for i, term in enumerate(terms(reward, env_names)):
        where = "reward" if isinstance(reward, str) else f"reward.{i}"
        try:
            fn = resolve_function(term.fn)
        except ValueError as e:
            hint = f"; this environment's evaluate is 'env' or {', '.join(env_names)}" if env_names else ""
            out.append((where, f"{e}{hint}"))
            continue
        try:  # its args must fit: a term that cannot be called would fail every episode
            inspect.signature(fn).bind(None, **term.args)
        except TypeError as e:
            out.append((f"{where}.args" if where != "reward" else where, f"{term.fn}: {e}"))
        except ValueError:
            pass  # no signature to check (a builtin)
    return out


def _model_of_kind(kind: str) -> type[BaseModel] | None:
    """Any registered environment's task model of ``kind``, to check tasks when the env is unknown."""
    for s in registry().values():
        try:
            model = s.load_task_model()
        except (ImportError, TypeError):
            continue
        if model is not None and task_kind(model) == kind:
            return model
    return None
