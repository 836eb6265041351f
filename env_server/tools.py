"""The ``@tool`` decorator: typed methods become tools with validated arguments and JSON schemas.

The schema comes from the signature (pydantic builds it from the type hints and defaults) and the
Google-style docstring (the summary describes the tool, ``Args:`` describe the parameters), so the
model sees exactly what the code accepts. Arguments are validated before the method runs, and
every number in them must be finite (NaN and infinities are refused, nested ones and ones a float
field would make of ``"nan"`` or ``"1e999"`` too), so no tool's own bounds can be slipped past.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints, overload

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from pqrl.finite import nonfinite_path

__all__ = ["ToolSpec", "collect_tools", "tool"]

_ATTR = "__pqrl_tool__"
_Method = TypeVar("_Method", bound=Callable[..., Awaitable[Any]])


@functools.cache
def _parameters(args_model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of a tool's arguments, made once per model: pydantic builds it in about a
    millisecond, which every session's reset would otherwise pay for every tool."""
    params = args_model.model_json_schema()
    params.pop("title", None)
    for prop in params.get("properties", {}).values():
        prop.pop("title", None)
    return params


@dataclass(frozen=True)
class ToolSpec:
    """A tool: its name, description, argument model and whether calling it ends the episode."""

    name: str
    description: str
    args_model: type[BaseModel]
    method_name: str
    final: bool = False

    def schema(self) -> dict[str, Any]:
        """OpenAI-style function schema (a fresh copy: the caller may change it)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description,
                         "parameters": copy.deepcopy(_parameters(self.args_model))},
        }  # fmt: skip

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments. Raises ValueError with a message meant for the model."""
        try:
            model = self.args_model.model_validate(arguments)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in e.errors()
            )
            raise ValueError(f"invalid arguments for {self.name}: {problems}") from None
        # also what the argument model let through: NaN in an Any field, or made by a nested model
        # of the tool's own that allows it
        where = nonfinite_path(arguments)
        where = where if where is not None else nonfinite_path(model.model_dump())
        if where is not None:
            raise ValueError(f"invalid arguments for {self.name}: {where or 'arguments'}: "
                             "Input should be a finite number")  # fmt: skip
        return {k: getattr(model, k) for k in type(model).model_fields}


@overload
def tool(fn: _Method) -> _Method: ...


@overload
def tool(*, name: str | None = None, final: bool = False) -> Callable[[_Method], _Method]: ...


def tool(
    fn: _Method | None = None, *, name: str | None = None, final: bool = False
) -> _Method | Callable[[_Method], _Method]:
    """Marks an async method of a ToolEnvironment as a tool.

    Args:
        name: the tool's name as the model sees it (default: the method name).
        final: calling this tool ends the episode (e.g. ``submit`` or ``answer``).

    Use as ``@tool`` or ``@tool(final=True)``.
    """

    def mark(f: _Method) -> _Method:
        is_async: bool = inspect.iscoroutinefunction(f)  # a bool: a TypeGuard would retype f
        if not is_async:
            raise TypeError(f"@tool {f.__qualname__} must be an async method")
        setattr(f, _ATTR, {"name": name or f.__name__, "final": final})
        return f

    return mark(fn) if fn is not None else mark


def _spec(method: Callable[..., Any], name: str, final: bool) -> ToolSpec:
    doc = docstring_parser.parse(inspect.getdoc(method) or "")
    described = {p.arg_name: p.description for p in doc.params}
    hints = get_type_hints(method, include_extras=True)  # keep Annotated[int, Field(ge=1)] constraints
    fields: dict[str, Any] = {}
    for pname, param in list(inspect.signature(method).parameters.items())[1:]:  # skip self
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"@tool {method.__qualname__}: *args/**kwargs cannot be described to a model")
        if pname not in hints:
            raise TypeError(f"@tool {method.__qualname__}: parameter {pname!r} needs a type hint")
        default = ... if param.default is param.empty else param.default
        fields[pname] = (hints[pname], Field(default, description=described.get(pname)))
    description = " ".join(x for x in (doc.short_description, doc.long_description) if x)
    if not description:
        raise TypeError(f"@tool {method.__qualname__} needs a docstring: it is the tool's description")
    config = ConfigDict(extra="forbid", allow_inf_nan=False)  # every float field of every tool is finite
    model = create_model(f"{name}_args", __config__=config, **fields)
    return ToolSpec(
        name=name, description=description, args_model=model, method_name=method.__name__, final=final
    )


def collect_tools(cls: type) -> dict[str, ToolSpec]:
    """The tools of a class (including inherited ones), by name."""
    tools: dict[str, ToolSpec] = {}
    for klass in reversed(cls.__mro__):
        own: dict[str, str] = {}
        for attr, value in vars(klass).items():
            marker = getattr(value, _ATTR, None)
            if marker is None:
                continue
            if marker["name"] in own:  # a subclass may override a tool, one class may not define it twice
                raise TypeError(f"{klass.__qualname__}: methods {own[marker['name']]} and {attr} are both "
                                f"tool {marker['name']!r}")  # fmt: skip
            own[marker["name"]] = attr
            tools[marker["name"]] = _spec(getattr(cls, attr), marker["name"], marker["final"])
    return tools
