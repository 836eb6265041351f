"""Finite numbers only, at every boundary that reads one from outside.

A NaN compares false with everything, so ``timeout <= 0`` and ``min(max(t, 0.1), 300)`` both let
it through (``min(max(nan, 0.1), 300)`` is NaN), and an infinity is a wait that never ends. JSON
text can carry either (``NaN``, ``Infinity``, ``1e999``; Python's ``json`` reads them all), and so
can a string given to ``float`` (``"nan"``, ``"inf"``). These helpers refuse them with a message
meant for whoever sent the value.
"""

from __future__ import annotations

import json
import math
import sys
from decimal import Decimal
from typing import Any

__all__ = ["bounded", "finite", "loads_finite", "nonfinite_path", "raw_decode_finite"]


def finite(value: Any, name: str = "value") -> float:
    """``float(value)``, refused (ValueError) unless it is a finite number."""
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond a float's range
        raise ValueError(f"{name} must be a finite number, got {_short(value)}") from None
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite number, got {_short(value)}")
    return x


def bounded(value: Any, low: float, high: float, name: str = "value") -> float:
    """``value`` as a finite float clamped to ``[low, high]``; a non-finite value is refused."""
    return min(max(finite(value, name), low), high)


def nonfinite_path(value: Any, path: str = "") -> str | None:
    """Where the first non-finite float (or int beyond a float's range) sits in a JSON-like value
    (``"a.b[2]"``; ``path`` for the value itself), or None when every number is finite."""
    # iterative, and a place is spelled out only when found: deep nesting must neither exhaust the
    # recursion limit nor cost a path string per element
    stack: list[tuple[Any, Any]] = [(value, None)]
    while stack:
        v, place = stack.pop()
        if isinstance(v, dict):
            stack.extend(reversed([(x, (place, k, False)) for k, x in v.items()]))
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed([(x, (place, i, True)) for i, x in enumerate(v)]))
        elif _nonfinite(v):
            return _spelled(place, path)
    return None


def _spelled(place: Any, path: str) -> str:
    parts: list[str] = []
    while place is not None:
        place, key, indexed = place
        parts.append(f"[{key}]" if indexed else f".{key}")
    text = path + "".join(reversed(parts))
    return text[1:] if text.startswith(".") and not path else text


def _nonfinite(v: Any) -> bool:
    if isinstance(v, float):
        return not math.isfinite(v)
    if isinstance(v, Decimal):
        return not v.is_finite()
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) > sys.float_info.max


def _constant(text: str) -> Any:
    raise ValueError(f"{text} is not a finite number")


def _float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"{_short(text)} is too large to be a number")
    return x


def _int(text: str) -> int:
    x = int(text)
    if abs(x) > sys.float_info.max:
        raise ValueError(f"{_short(text)} is too large to be a number")
    return x


def loads_finite(text: str | bytes) -> Any:
    """``json.loads`` that refuses ``NaN``, ``Infinity``, ``-Infinity`` and numbers beyond a
    float's range (ValueError; ``json.JSONDecodeError`` for text that is not JSON, nesting too deep
    for the decoder included)."""
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except RecursionError:  # "[[[[...": the C scanner recurses per level
        raise json.JSONDecodeError("nested too deeply", _text(text), 0) from None


_FINITE_JSON = json.JSONDecoder(parse_constant=_constant, parse_float=_float, parse_int=_int)


def raw_decode_finite(text: str, at: int = 0) -> tuple[Any, int]:
    """The finite JSON value starting at ``text[at]`` and where it ends, for JSON embedded in longer
    text; the same errors as ``loads_finite``."""
    try:
        return _FINITE_JSON.raw_decode(text, at)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, at) from None


def _text(text: str | bytes) -> str:
    return text if isinstance(text, str) else text.decode("utf-8", "replace")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
