"""The finite-number helpers every boundary uses: NaN, infinities and numbers beyond a float's
range are refused, finite ones pass (clamped where a bound is given)."""

from __future__ import annotations

import json
import math
from decimal import Decimal

import pytest

from pqrl.finite import bounded, finite, loads_finite, nonfinite_path

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("value", [NAN, INF, -INF, "nan", "inf", "-Infinity", "1e999", 10**400, None, [1]])
def test_finite_refuses_what_is_not_a_finite_number(value):
    with pytest.raises(ValueError, match="timeout must be a finite number"):
        finite(value, "timeout")


@pytest.mark.parametrize(("value", "expected"), [(3, 3.0), ("2.5", 2.5), (-1e308, -1e308), (True, 1.0)])
def test_finite_passes_finite_numbers(value, expected):
    assert finite(value) == expected


def test_bounded_clamps_finite_values_and_refuses_nan_where_min_max_would_not():
    assert math.isnan(min(max(NAN, 0.1), 300.0)), "the clamp this replaces lets NaN through"
    assert bounded(5, 0.1, 300.0) == 5.0
    assert bounded(-7, 0.1, 300.0) == 0.1
    assert bounded(1e300, 0.1, 300.0) == 300.0
    for bad in (NAN, INF, -INF):
        with pytest.raises(ValueError, match="t must be a finite number"):
            bounded(bad, 0.1, 300.0, "t")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("NaN", "NaN is not a finite number"),
        ('{"a": Infinity}', "Infinity is not a finite number"),
        ("[-Infinity]", "-Infinity is not a finite number"),
        ('{"t": 1e999}', "'1e999' is too large to be a number"),
        ('{"t": -1E+400}', "too large to be a number"),
        ("1" + "0" * 400, "too large to be a number"),
        ('{"a": {"b": [1, {"c": NaN}]}}', "NaN is not a finite number"),
    ],
)
def test_loads_finite_refuses_non_finite_json(text, says):
    assert nonfinite_path(json.loads(text)) is not None, "plain json reads it as a non-finite number"
    with pytest.raises(ValueError, match=says):
        loads_finite(text)


def test_loads_finite_reads_ordinary_json_and_reports_bad_json_as_a_decode_error():
    assert loads_finite('{"a": [1, 2.5e10, -3e-5, "NaN", null, true]}') == {
        "a": [1, 2.5e10, -3e-5, "NaN", None, True]
    }
    with pytest.raises(json.JSONDecodeError):
        loads_finite('{"a": ')


def test_nonfinite_path_names_where_the_number_sits():
    assert nonfinite_path({"a": [1, {"b": NAN}], "c": 2}) == "a[1].b"
    assert nonfinite_path({"d": [Decimal("1.5"), Decimal("-Infinity")]}) == "d[1]"
    assert nonfinite_path([0, (1, -INF)]) == "[1][1]"
    assert nonfinite_path(INF) == "" and nonfinite_path(10**400, "seed") == "seed"
    assert nonfinite_path({"a": [1, 2.0, "inf", None, True, {"b": 10**300}]}) is None


def test_nonfinite_path_walks_deep_nesting_without_recursing():
    deep: object = NAN
    for _ in range(100_000):
        deep = [deep]
    assert nonfinite_path(deep) == "[0]" * 100_000
