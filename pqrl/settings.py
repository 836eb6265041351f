"""Settings declared once: a component's config is a frozen dataclass whose fields carry their
description and bounds; the job config, ``pqrl train --explain`` and the command-line flags are all
derived from it.

A field is declared with ``setting(default, "what it means", ge=..., gt=..., le=..., lt=...)``.
The metadata keys are the ones pydantic reads from dataclass fields, so a job config that nests
these classes validates bounds, ``Literal`` choices and unknown keys (``__pydantic_config__``) with
errors naming the field path. ``Settings.__post_init__`` applies the same bounds when a config is
built in code, so a bad value fails where it is written.

Standard library only: the compute path (trainer step, engine batcher) imports its configs from
here on machines without pydantic.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Iterator, Sequence
from typing import Any, Literal, get_args, get_origin

__all__ = ["FieldInfo", "Settings", "add_arguments", "fields_of", "from_arguments", "setting", "type_name"]

_BOUNDS = {"ge": (lambda v, b: v >= b, ">="), "gt": (lambda v, b: v > b, ">"),
           "le": (lambda v, b: v <= b, "<="), "lt": (lambda v, b: v < b, "<")}  # fmt: skip
_NO_DEFAULT: Any = dataclasses.MISSING


def setting(
    default: Any = _NO_DEFAULT,
    description: str = "",
    *,
    factory: Any = _NO_DEFAULT,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A dataclass field with its description and bounds (no default and no factory: required)."""
    metadata: dict[str, Any] = {"description": description}
    metadata |= {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    return dataclasses.field(default=default, default_factory=factory, metadata=metadata)


class Settings:
    """Base of config dataclasses: checks every field's bounds and ``Literal`` choices on creation.

    Subclasses are ``@dataclasses.dataclass(frozen=True, kw_only=True)``; unknown keys are refused
    when a job config nests them.
    """

    # a NaN passes every bound (each comparison is False) and an infinity is no bound at all
    __pydantic_config__ = {"extra": "forbid", "allow_inf_nan": False}

    def __post_init__(self) -> None:
        cls: type = type(self)  # as a plain type: mypy takes type[Settings] for unhashable
        hints = _hints(cls)
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            base, optional = _unwrap_optional(hints[f.name])
            if optional and value is None:
                continue
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{type(self).__name__}.{f.name} must be a finite number, got {value!r}")
            for key, (ok, sign) in _BOUNDS.items():
                bound = f.metadata.get(key)
                if bound is not None and isinstance(value, int | float) and not ok(value, bound):
                    raise ValueError(f"{type(self).__name__}.{f.name} must be {sign} {bound}, got {value!r}")
            choices = _choices(base)
            if choices is not None and value not in choices:
                raise ValueError(
                    f"{type(self).__name__}.{f.name} must be one of {list(choices)}, got {value!r}"
                )


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    name: str
    type: Any
    default: Any  # _NO_DEFAULT when required
    description: str
    bounds: dict[str, float]  # ge / gt / le / lt as given to ``setting``

    @property
    def required(self) -> bool:
        return self.default is _NO_DEFAULT


def fields_of(cls: type) -> Iterator[FieldInfo]:
    """The fields of a settings dataclass, with resolved types and defaults (factories called)."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.default is not _NO_DEFAULT:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = _NO_DEFAULT
        bounds = {k: f.metadata[k] for k in _BOUNDS if k in f.metadata}
        yield FieldInfo(f.name, hints[f.name], default, f.metadata.get("description", ""), bounds)


def add_arguments(parser: argparse.ArgumentParser | Any, cls: type, *, exclude: Sequence[str] = ()) -> None:
    """One ``--flag`` per scalar field of ``cls`` (``max_turns`` -> ``--max-turns``), default and help
    taken from the field; nested settings and fields in ``exclude`` are left out."""
    for f in fields_of(cls):
        if f.name in exclude or _is_settings(f.type):
            continue
        flag = "--" + f.name.replace("_", "-")
        help_ = f"{f.description} (default: {f.default!r})" if not f.required else f.description
        base, optional = _unwrap_optional(f.type)
        kwargs: dict[str, Any] = {"dest": f.name, "help": help_}
        if f.required:
            kwargs["required"] = True
        else:
            kwargs["default"] = f.default
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif _choices(base) is not None:
            kwargs["choices"] = list(_choices(base))  # type: ignore[arg-type]
            kwargs["type"] = type(kwargs["choices"][0])
        elif get_origin(base) is tuple:
            kwargs["nargs"] = "*"
            kwargs["type"] = get_args(base)[0]
        elif base in (int, float, str):
            kwargs["type"] = base
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: no command-line form for {type_name(f.type)}")
        if optional and kwargs.get("type") in (int, float):
            kwargs["type"] = _optional(kwargs["type"])
        parser.add_argument(flag, **kwargs)


def from_arguments(cls: type, args: argparse.Namespace, **given: Any) -> Any:
    """``cls`` built from the parsed flags that ``add_arguments`` declared, plus ``given`` fields."""
    values = {f.name: getattr(args, f.name) for f in fields_of(cls) if hasattr(args, f.name)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**(values | given))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_settings(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _choices(tp: Any) -> tuple[Any, ...] | None:
    return get_args(tp) if get_origin(tp) is Literal else None


def _optional(convert: Any) -> Any:
    def parse(text: str) -> Any:
        return None if text.lower() in ("", "none") else convert(text)

    parse.__name__ = convert.__name__
    return parse


def type_name(tp: Any) -> str:
    """An annotation as a reader writes it: ``int``, ``'a' | 'b'``, ``float | None``, ``list[str]``."""
    if isinstance(tp, type) and get_origin(tp) is None:
        return tp.__name__
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    base, optional = _unwrap_optional(tp)
    if optional:
        return f"{type_name(base)} | None"
    return re.sub(r"\b[\w.]+\.(\w+)", r"\1", str(tp).replace("typing.", ""))  # module paths off
