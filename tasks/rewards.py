"""Rewards as composable functions: what a suite's ``reward`` (or a job's ``tasks.suites[].reward``)
selects, like TRL's ``reward_funcs`` with ``reward_weights``.

    "reward": "env"                                   # the environment's evaluate (the default)
    "reward": "exact_match"                           # the same, by a name the environment gives it
    "reward": ["env", {"fn": "tool_format", "weight": 0.1},
               {"fn": "length_penalty", "weight": 0.5, "args": {"limit": 256}},
               {"fn": "my_pkg.rewards:brevity"}]      # a weighted sum

Each term is a pure function of the finished ``Episode`` (and its ``args``) returning a finite
float; the reward is the sum of ``weight * fn(episode, **args)``. ``env`` is the environment's own
score. A user function is named ``module:function`` and imported where the episode is scored.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from pqrl.shaping import overlong_penalty

__all__ = [
    "REWARD_FUNCTIONS",
    "Episode",
    "RewardSpec",
    "RewardTerm",
    "combine",
    "env_reward",
    "length_penalty",
    "queued_terms",
    "resolve_function",
    "terms",
    "tool_format",
]


@dataclass(frozen=True)
class Episode:
    """What a reward function sees of a finished episode."""

    env_reward: float
    env_info: dict[str, Any] = field(default_factory=dict)
    completion: str = ""  # the assistant turns' text, in order
    turns: int = 0
    tool_calls: int = 0
    ok_calls: int = 0  # calls that ran and returned (status ok)
    generated_tokens: int = 0
    task: dict[str, Any] = field(default_factory=dict)


class RewardTerm(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    fn: str = Field(min_length=1, description="a built-in name, 'env', or 'module:function'")
    weight: float = 1.0
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of fn")


def _spec(value: Any) -> Any:
    """A reward spec's shape, with one message per bad term (a union's errors name its members)."""
    if isinstance(value, str):
        if not value:
            raise ValueError("give 'env', a function's name or a list of terms")
        return value
    if not isinstance(value, list) or not value:
        raise ValueError("must be a name or a non-empty list of terms")
    out: list[str | RewardTerm] = []
    for i, term in enumerate(value):
        if isinstance(term, str | RewardTerm):
            out.append(term)
            continue
        try:
            out.append(RewardTerm.model_validate(term))
        except ValidationError as e:
            why = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'term'}: {err['msg']}" for err in e.errors())
            raise ValueError(f"term {i}: {why}") from None
    return out


RewardSpec = Annotated[str | list[str | RewardTerm], BeforeValidator(_spec)]


def env_reward(ep: Episode) -> float:
    """The environment's own score."""
    return ep.env_reward


def tool_format(ep: Episode) -> float:
    """The share of the episode's tool calls that parsed and ran (0 without any call)."""
    return ep.ok_calls / ep.tool_calls if ep.tool_calls else 0.0


def length_penalty(ep: Episode, *, limit: int, buffer: int = 0) -> float:
    """0 up to ``limit - buffer`` generated tokens, then linearly down to -1 at ``limit`` and
    beyond (DAPO's overlong shaping; ``buffer`` 0: -1 past the limit)."""
    if limit <= 0 or not 0 <= buffer <= limit:
        raise ValueError(f"length_penalty needs 0 <= buffer <= limit and limit > 0, got {limit}, {buffer}")
    if buffer == 0:  # a cliff: overlong_penalty's buffer 0 means no shaping at all
        return -1.0 if ep.generated_tokens > limit else 0.0
    return overlong_penalty(ep.generated_tokens, limit, buffer)


REWARD_FUNCTIONS: dict[str, Callable[..., float]] = {
    "env": env_reward,
    "tool_format": tool_format,
    "length_penalty": length_penalty,
}


def terms(spec: RewardSpec | list[dict[str, Any]], env_names: Sequence[str] = ()) -> list[RewardTerm]:
    """``spec`` as weighted terms; a name in ``env_names`` (what the environment calls its
    evaluate) is ``env``."""
    items: list[Any] = [spec] if isinstance(spec, str) else list(spec)
    # a queued task carries its terms as JSON objects
    out = [RewardTerm(fn=t) if isinstance(t, str) else RewardTerm.model_validate(t) for t in items]
    return [t.model_copy(update={"fn": "env"}) if t.fn in env_names else t for t in out]


def queued_terms(spec: RewardSpec) -> list[dict[str, Any]] | None:
    """The terms a validated suite's ``spec`` sends with each queued task, or None when it is the
    environment's evaluate alone. A name that is neither built in nor ``module:function`` passed
    validation as the environment's own name for its evaluate: it is ``env``."""
    out = []
    for t in terms(spec):
        own = t.fn not in REWARD_FUNCTIONS and ":" not in t.fn
        out.append(t.model_copy(update={"fn": "env"}) if own else t)
    if all(t.fn == "env" and t.weight == 1.0 for t in out) and len(out) == 1:
        return None
    return [t.model_dump() for t in out]


def resolve_function(name: str) -> Callable[..., float]:
    """The function a term names: built in, or ``module:function`` (imported now)."""
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[name]
    module, sep, attr = name.partition(":")
    if not sep:
        known = ", ".join(sorted(REWARD_FUNCTIONS))
        raise ValueError(f"unknown reward function {name!r}; built in: {known}, or give 'module:function'")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"reward function {name!r} cannot be loaded: {e}") from None
    if not callable(fn):
        raise ValueError(f"reward function {name!r} is not callable")
    return fn  # type: ignore[no-any-return]


def combine(
    spec: RewardSpec | list[dict[str, Any]], ep: Episode, env_names: Sequence[str] = ()
) -> tuple[float, dict[str, float]]:
    """(the weighted sum, each term's unweighted value by its position and name). Raises
    ValueError for a function that fails or gives a value that is not a finite number."""
    total, values = 0.0, {}
    for i, term in enumerate(terms(spec, env_names)):
        try:
            value = resolve_function(term.fn)(ep, **term.args)
        except ValueError:
            raise
        except Exception as e:  # a user function's bug is this episode's scoring failure
            raise ValueError(f"reward function {term.fn} failed: {type(e).__name__}: {e}") from e
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"reward function {term.fn} gave {value!r}, not a finite number")
        values[f"{i}:{term.fn}"] = float(value)
        total += term.weight * float(value)
    return total, values
