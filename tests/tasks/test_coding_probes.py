"""Held-out expectations, pure parts: the rewriting keeps expected values out of the container, the
recorder encodes what the code computed, and the host judges records with the original asserts'
meaning. The container side runs in tests/tasks/test_coding_hacks.py and test_coding_grading.py."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tasks.coding import probe_runtime, probes
from tasks.coding.env import builtin_suite

TESTS = {
    "tests/test_m.py": (
        "import pytest\nfrom m import f, g\n\n\n"
        "def test_values():\n"
        "    assert f(2) == 41, 'f(2) should be 41'\n"
        "    assert not g(3)\n"
        "    assert g(4)\n"
        "    assert f(0.1) == pytest.approx(0.3)\n"
        "    assert f(None) is None\n"
        "    assert len([f(1)]) < 5\n\n\n"
        "def test_raises():\n"
        "    with pytest.raises(ValueError, match='negative'):\n"
        "        f(-1)\n\n\n"
        "class TestComputed:\n"
        "    def test_both_sides(self):\n"
        "        assert f(1) == f(1)\n"
    )
}


def rewritten() -> probes.Instrumented:
    return probes.instrument(TESTS)


def test_no_expected_value_or_message_reaches_the_container():
    source = rewritten().files["tests/test_m.py"]
    for secret in ("41", "0.3", "should be", "ValueError", "negative", " < 5", "not g"):
        assert secret not in source, secret
    compile(source, "test_m.py", "exec")  # still a valid test module


def test_docstring_and_future_imports_stay_first():
    source = '"""Tests."""\n\nfrom __future__ import annotations\n\n\ndef test_x():\n    assert 1 + 1 == 2\n'
    rewritten = probes.instrument({"tests/test_f.py": source}).files["tests/test_f.py"]
    compile(rewritten, "test_f.py", "exec")  # a __future__ import after another statement does not compile
    lines = rewritten.splitlines()
    assert lines[0] == '"""Tests."""' and lines[1].startswith("from __future__")
    assert lines[2].startswith(f"from {probes.MODULE} import")


def test_asserts_that_need_their_frame_stay_as_they_are():
    source = (
        "async def test_a():\n    assert await f() == 1\n\n\n"
        "def test_b():\n    assert (n := g()) == 2\n    assert n == 2\n\n\n"
        "class TestC(Base):\n    def test_c(self):\n        assert super().h() == 3\n"
    )
    rewritten = probes.instrument({"tests/test_f.py": source}).files["tests/test_f.py"]
    compile(rewritten, "test_f.py", "exec")
    assert "assert await f() == 1" in rewritten and "assert (n := g()) == 2" in rewritten
    assert "assert super().h() == 3" in rewritten
    assert "_pqrl_probe(0, (), lambda: n)" in rewritten  # the one after the walrus is rewritten


def test_sites_keep_the_expectations_on_the_host():
    sites = list(rewritten().sites.values())
    kinds = [(s.kind, s.test, s.negated, s.strong) for s in sites]
    assert kinds == [
        ("compare", "tests/test_m.py::test_values", False, True),
        ("value", "tests/test_m.py::test_values", True, True),
        ("value", "tests/test_m.py::test_values", False, True),
        ("compare", "tests/test_m.py::test_values", False, True),
        ("compare", "tests/test_m.py::test_values", False, True),
        ("compare", "tests/test_m.py::test_values", False, True),
        ("raises", "tests/test_m.py::test_raises", False, False),
        ("compare", "tests/test_m.py::TestComputed::test_both_sides", False, False),
    ]
    assert sites[0].literals == ((1, 41),) and sites[6].raises == ("ValueError",)
    assert sites[6].match == "negative"


def entry(site: int, *values) -> tuple[int, list]:
    return site, [probe_runtime.encode(v) if not isinstance(v, dict) else v for v in values]


VALUE_ERROR = ["builtins.ValueError", "builtins.Exception", "builtins.BaseException", "builtins.object"]
EVERY_NAME = VALUE_ERROR + ["builtins.TypeError", "m.NegativeError", "NegativeError", "ValueError"]
GOLD = {
    "t": [
        entry(0, 41),
        entry(1, {"!truth": False}),
        entry(2, {"!truth": True}),
        entry(3, 0.30000000000000004),
        entry(4, None),
        entry(5, 1),
        entry(6, {"!raised": VALUE_ERROR, "msg": "negative input"}),
        entry(7, 3, 3, {"!truth": True}),
    ]
}


def judged(record: dict, unstable=frozenset()) -> dict[str, str]:
    return probes.compare(GOLD, record, rewritten().sites, ["t"], unstable)


@pytest.mark.parametrize(
    ("index", "replacement", "passes"),
    [
        (None, None, True),
        (0, entry(0, 40), False),
        (0, entry(0, 41.0), True),  # the original ``== 41`` holds for 41.0 too
        (1, entry(1, {"!truth": True}), False),  # polarity is held on the host
        (3, entry(3, 0.3000001), True),  # approx's tolerance
        (3, entry(3, 0.31), False),
        (4, entry(4, 0), False),
        (5, entry(5, 3), True),  # ``len(...) < 5`` only asks for less than 5
        (5, entry(5, 9), False),
        (5, entry(5, {"!raised": ["TypeError"]}), False),
        (6, entry(6, {"!raised": VALUE_ERROR, "msg": "negative!"}), True),
        (6, entry(6, {"!raised": ["builtins.TypeError"], "msg": "negative"}), False),
        (6, entry(6, {"!raised": VALUE_ERROR, "msg": "bad"}), False),  # match= is held on the host
        # identity, not membership: the gold's very class, every base in order, modules included
        (6, entry(6, {"!raised": EVERY_NAME, "msg": "negative"}), False),
        (6, entry(6, {"!raised": ["m.NegativeError", *VALUE_ERROR], "msg": "negative"}), False),
        (
            6,
            entry(6, {"!raised": ["ValueError", "Exception", "BaseException", "object"], "msg": "negative"}),
            False,
        ),
        (6, entry(6, {"!raised": ["x.ValueError", *VALUE_ERROR[1:]], "msg": "negative"}), False),
        (6, entry(6, {"!raised": None}), False),
        (7, entry(7, 4, 4, {"!truth": True}), False),  # self-consistent but not the correct value
        (7, entry(6, 3, 3, {"!truth": True}), False),  # a check from elsewhere
    ],
)
def test_a_record_is_judged_with_the_original_meaning(index, replacement, passes):
    record = {"t": list(GOLD["t"])}
    if index is not None:
        record["t"][index] = replacement
    assert (judged(record) == {}) is passes, judged(record)


def test_a_short_or_missing_record_fails_and_says_where_not_what():
    assert "checks recorded" in judged({"t": GOLD["t"][:-1]})["t"]
    assert judged({})["t"]
    reason = judged({"t": [entry(0, 40), *GOLD["t"][1:]]})["t"]
    assert "tests/test_m.py:6" in reason and "41" not in reason


def test_unstable_gold_entries_are_judged_by_the_assert_alone():
    other = {"t": [*GOLD["t"][:7], entry(7, 5, 5, {"!truth": True})]}
    entries, tests = probes.unstable_entries(GOLD, other)
    assert entries == {("t", 7)} and not tests
    record = {"t": [*GOLD["t"][:7], entry(7, 9, 9, {"!truth": True})]}
    assert judged(record, entries) == {}
    record["t"][7] = entry(7, 9, 8, {"!truth": False})
    assert judged(record, entries)


def test_a_raises_site_whose_message_varies_still_needs_the_gold_class():
    unstable = {("t", 6)}
    record = {"t": list(GOLD["t"])}
    record["t"][6] = entry(6, {"!raised": VALUE_ERROR, "msg": "negative, other run"})
    assert judged(record, unstable) == {}
    record["t"][6] = entry(6, {"!raised": EVERY_NAME, "msg": "negative"})
    assert judged(record, unstable)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, 3),
        (2**80, 2**80),
        (float("inf"), float("inf")),
        ("x" * 20, "x" * 20),
        ([1, (2, 3)], [1, (2, 3)]),
        ({"a": {1, 2}}, {"a": {1, 2}}),
        (b"\x00\xff", b"\x00\xff"),
        (1 + 2j, 1 + 2j),
    ],
)
def test_builtin_values_survive_the_round_trip(value, expected):
    assert probes.decode(json.loads(json.dumps(probe_runtime.encode(value)))) == expected


def test_other_objects_are_recorded_by_type_without_running_their_code():
    class Sneaky:
        def __eq__(self, other):
            raise AssertionError("ran")

        def __repr__(self):
            raise AssertionError("ran")

    encoded = probe_runtime.encode([Sneaky()])
    assert encoded["list"][0]["obj"].endswith("Sneaky")
    assert isinstance(probes.decode(encoded["list"][0]), probes.Opaque)


def test_the_recorder_writes_one_line_per_check(tmp_path, monkeypatch):
    r, w = os.pipe()
    monkeypatch.setattr(probe_runtime, "_FD", w)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_m.py::test_values (call)")
    probe_runtime.probe(0, (), lambda: 41)
    probe_runtime.probe(1, ("bool",), lambda: [])
    with pytest.raises(ZeroDivisionError):  # recorded, then raised on as the assert raises it
        probe_runtime.probe(2, ("==",), lambda: 1, lambda: 1 / 0)
    with probe_runtime.raises(3):
        raise ValueError("negative")
    os.close(w)
    record = probes.parse_record(os.read(r, 1 << 16))
    os.close(r)
    assert record["tests/test_m.py::test_values"] == [
        (0, [41]),
        (1, [{"!truth": False}]),
        (
            2,
            [
                1,
                {
                    "!raised": [
                        f"builtins.{c}" for c in ("ZeroDivisionError", "ArithmeticError", "Exception")
                    ]
                    + ["builtins.BaseException", "builtins.object"]
                },
            ],
        ),
        (3, [{"!raised": VALUE_ERROR, "msg": "negative"}]),
    ]


def test_every_builtin_task_keeps_its_expectations_on_the_host():
    """Most fail-to-pass tests have at least one check whose expectation never enters the
    container; the rest compare against values the test computes itself (a stated limit)."""
    suite = builtin_suite()
    weak = [
        t.id
        for t in suite.tasks
        if not any(f in probes.strong_tests(probes.instrument(t.hidden_tests).sites) for f in t.fail_to_pass)
    ]
    assert len(weak) <= 5, weak
    assert sys.version_info >= (3, 9)  # ast.unparse
