"""The environment registry: ids to lazy ``"module:Class"`` entry points, plus pip plug-ins.

    register_environment("calc-v1", entry_point="tasks.calc:CalcEnv", max_turns=8)
    env = make("calc-v1")            # imported on first use, wrapped with the spec's limits

Installed packages add environments through the entry-point group ``pqrl.environments``: each
entry point names a callable that calls ``register_environment`` (see examples/custom_env).

An environment declares the tasks it runs (``task_model``: a pydantic model with ``id`` and a
``kind`` whose default names the kind) and a worked example (``example_calls``: the tool calls of a
correct episode of ``sample_task``), on its class or when it registers; the registration wins.
"""

from __future__ import annotations

import importlib
import logging
import re
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel

from env_server.environment import ToolEnvironment
from env_server.wrappers import ObservationCap, ToolTimeout, TurnLimit, Wrapper

__all__ = [
    "EnvSpec",
    "UnknownEnvironment",
    "load_plugins",
    "make",
    "register_environment",
    "registry",
    "spec",
    "task_kind",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "pqrl.environments"
BUILTIN_PLUGIN = "env_server.builtin:register"
_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*-v\d+$")
_REGISTRY: dict[str, EnvSpec] = {}
_plugins_loaded = False


class UnknownEnvironment(KeyError):
    def __init__(self, env_id: str) -> None:
        super().__init__(env_id)
        self.env_id = env_id

    def __str__(self) -> str:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        return f"unknown environment {self.env_id!r}; registered: {known}"


@dataclass(frozen=True)
class EnvSpec:
    """How to build one registered environment.

    Attributes:
        id: ``name-vN``; a new version is a new id, so results stay comparable.
        entry_point: ``"package.module:ClassName"``, imported on first use.
        kwargs: passed to the class (its ``config``); ``make`` may override them.
        max_turns: steps before the episode is cut (``TurnLimit``); None for no limit.
        tool_timeout_s: per tool call (``ToolTimeout``); None for no limit.
        max_observation_chars: per message (``ObservationCap``); None for no cap.
        sample_task: a task the conformance checker can run (see env_server.conformance).
        task_model: the tasks' pydantic model, or ``"module:Class"``; None: the class's own.
        example_calls: the calls (``{"name", "arguments"}``) of a correct episode of
            ``sample_task``, one step each; None: the class's ``worked_example``.
    """

    id: str
    entry_point: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    max_turns: int | None = 16
    tool_timeout_s: float | None = 60.0
    max_observation_chars: int | None = 16_384
    sample_task: dict[str, Any] = field(default_factory=dict)
    task_model: Any = None
    example_calls: tuple[dict[str, Any], ...] | None = None

    def load(self) -> type[ToolEnvironment]:
        try:
            cls = resolve(self.entry_point)
        except Exception as e:  # a plug-in's module may fail at import in any way: it cannot load
            raise ImportError(
                f"environment {self.id!r}: cannot load {self.entry_point!r}: {type(e).__name__}: {e}"
            ) from e
        if not (isinstance(cls, type) and issubclass(cls, ToolEnvironment)):
            raise TypeError(
                f"environment {self.id!r}: {self.entry_point!r} is not a ToolEnvironment subclass"
            )
        return cls

    def load_task_model(self) -> type[BaseModel] | None:
        """The model of this environment's tasks: the registration's, else the class's, else None."""
        model = self.task_model if self.task_model is not None else self.load().task_model
        if isinstance(model, str):
            try:
                model = resolve(model)
            except Exception as e:
                raise ImportError(f"environment {self.id!r}: cannot load task model {model!r}: {e}") from e
        if model is not None:
            task_kind(model)  # checks its shape
        return model


def task_kind(model: Any) -> str:
    """The kind a task model declares: the default of its ``kind`` field (it must also have ``id``)."""
    fields = getattr(model, "model_fields", None)
    if not (isinstance(model, type) and issubclass(model, BaseModel) and fields):
        raise TypeError(f"task model {model!r} is not a pydantic model")
    kind = fields["kind"].default if "kind" in fields else None
    if not isinstance(kind, str) or "id" not in fields:
        raise TypeError(f"task model {model.__name__} needs an 'id' field and a 'kind' field with a default")
    return kind


def register_environment(
    env_id: str,
    entry_point: str,
    *,
    max_turns: int | None = 16,
    tool_timeout_s: float | None = 60.0,
    max_observation_chars: int | None = 16_384,
    sample_task: dict[str, Any] | None = None,
    task_model: Any = None,
    example_calls: list[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> EnvSpec:
    """Registers ``env_id``; re-registering the same spec is a no-op, a different one an error."""
    if not _ID.match(env_id):
        raise ValueError(f"environment id {env_id!r} must look like 'name-v1'")
    if ":" not in entry_point:
        raise ValueError(f"entry_point {entry_point!r} must look like 'package.module:ClassName'")
    if task_model is not None and not isinstance(task_model, str):
        task_kind(task_model)
    new = EnvSpec(
        env_id,
        entry_point,
        dict(kwargs),
        max_turns,
        tool_timeout_s,
        max_observation_chars,
        dict(sample_task or {}),
        task_model,
        None if example_calls is None else tuple(dict(c) for c in example_calls),
    )
    old = _REGISTRY.get(env_id)
    if old is not None and old != new:
        raise ValueError(f"environment {env_id!r} is already registered with a different spec: {old}")
    _REGISTRY[env_id] = new
    return new


def resolve(reference: str) -> Any:
    """The object a ``"package.module:attribute"`` reference names, its module imported now."""
    module_name, _, attr = reference.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def load_plugins() -> None:
    """Runs every installed ``pqrl.environments`` entry point once."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    # the built-in environments register themselves through this module, like any plug-in, and also
    # where pqrl is not pip-installed (no entry points)
    resolve(BUILTIN_PLUGIN)()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            target = ep.load()
            if callable(target):
                target()
        except Exception as e:  # one broken plug-in must not hide the others
            log.error("environment plug-in %s (%s) failed to load: %s", ep.name, ep.value, e)


def registry() -> dict[str, EnvSpec]:
    load_plugins()
    return dict(_REGISTRY)


def spec(env_id: str) -> EnvSpec:
    load_plugins()
    try:
        return _REGISTRY[env_id]
    except KeyError:
        raise UnknownEnvironment(env_id) from None


def make(env_id: str, **overrides: Any) -> ToolEnvironment | Wrapper:
    """A new instance of ``env_id`` with its spec's limits applied as wrappers."""
    s = spec(env_id)
    env: ToolEnvironment | Wrapper = s.load()(**{**s.kwargs, **overrides})
    if s.tool_timeout_s is not None:
        env = ToolTimeout(env, s.tool_timeout_s)
    if s.max_turns is not None:
        env = TurnLimit(env, s.max_turns)  # outside ToolTimeout: one step is one turn
    if s.max_observation_chars is not None:
        env = ObservationCap(env, s.max_observation_chars)
    return env
