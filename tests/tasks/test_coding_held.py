"""Expected operands held on the host, pure parts: which operand the fix changes decides what stays
in the container, the rewritten test no longer computes the held one, and the host judges the kept
operands by position against the gold's values. The container side (the base run, the gold's two
runs) is exercised by tests/tasks/test_coding_grading.py and the forger battery."""

from __future__ import annotations

from typing import Any

from tasks.coding import probes
from tasks.coding.held import held_operands, project, settle

TEST = "tests/test_m.py::test_sum"
SOURCE = (
    "from m import Money, total\n\n\n"
    "def test_sum():\n"
    "    assert total([2, 3]) == Money(5, 'EUR')\n"
    "    expected = total([1])\n"
    "    assert total([1]) == expected\n"
    "    assert total([4]) != Money(0, 'EUR')\n"
    "    assert total([4]) == [m for m in [Money(4, 'EUR')]]\n"
)
FILES = {"tests/test_m.py": SOURCE}
GOLD_5 = {"obj": "m.Money", "state": {"amount": 5, "currency": "EUR"}}
BUGGY_4 = {"obj": "m.Money", "state": {"amount": 4, "currency": "EUR"}}
TRUE = {"!truth": True}


def _sites() -> dict[int, probes.Site]:
    return probes.instrument(FILES).sites


def _records(first: Any, base_first: Any) -> tuple[dict, dict]:
    """Gold and base records of the fully rewritten SOURCE; only the first check differs."""
    same = [(1, [7, 7, TRUE]), (2, [{"obj": "m.Money", "state": {}}, {"obj": "m.Money", "state": {}}, TRUE])]
    gold = {TEST: [(0, [first, GOLD_5, TRUE]), *same]}
    base = {TEST: [(0, base_first), *same]}
    return gold, base


def test_the_operand_the_fix_leaves_alone_is_held_and_no_longer_computed():
    gold, base = _records(GOLD_5, [BUGGY_4, GOLD_5, {"!truth": False}])
    held = held_operands(_sites(), gold, base)
    assert held == {0: (1,)}  # Money(5, 'EUR') is the expected side; total([2, 3]) is the answer
    rewritten = probes.instrument(FILES, held).files["tests/test_m.py"]
    assert "Money(5" not in rewritten and "total([2, 3])" in rewritten
    assert "Money(0" in rewritten  # a != check is never held: "unequal to X" says less than "the gold's"
    compile(rewritten, "test_m.py", "exec")


def test_an_operand_the_base_never_reached_is_held_when_the_answer_raised():
    raised = {"!raised": ["m.Broken", "builtins.Exception", "builtins.BaseException", "builtins.object"]}
    gold, base = _records(GOLD_5, [raised])
    assert held_operands(_sites(), gold, base) == {0: (1,)}


def test_nothing_is_held_without_evidence_or_comparison_by_content():
    sites = _sites()
    gold, base = _records(GOLD_5, [GOLD_5, GOLD_5, TRUE])
    assert held_operands(sites, gold, base) == {}  # the unfixed code passes it: nothing to protect
    assert held_operands(sites, gold, {}) == {}  # the base recorded nothing: no evidence
    opaque = {"obj": "m.Money"}  # recorded by type alone: comparing it by position proves nothing
    gold, base = _records(opaque, [BUGGY_4, GOLD_5, {"!truth": False}])
    assert held_operands(sites, gold, base) == {}


def test_a_comprehension_is_never_held():
    sites = _sites()
    comp = next(s for s, site in sites.items() if site.line == 9)
    assert sites[comp].pure == (0,)  # total([4]) may be skipped; the comprehension may not


def test_a_held_check_passes_only_with_the_gold_answer():
    sites = probes.instrument(FILES, {0: (1,)}).sites
    gold = {TEST: [(0, [GOLD_5, GOLD_5, TRUE])]}
    ok = probes.compare(gold, {TEST: [(0, [GOLD_5])]}, sites, [TEST])
    assert ok == {}
    for forged in ([BUGGY_4], [GOLD_5, GOLD_5], [GOLD_5, TRUE], [TRUE], []):
        assert probes.compare(gold, {TEST: [(0, forged)]}, sites, [TEST]), forged


def test_settle_keeps_what_is_stable_and_refuses_a_run_that_changed():
    full = _sites()
    sites = probes.instrument(FILES, {0: (1,)}).sites
    first = {TEST: [(0, [GOLD_5, GOLD_5, TRUE]), (1, [7, 7, TRUE])]}
    second = project(first, sites)
    assert second[TEST][0] == (0, [GOLD_5])
    settled = settle(sites, first, second, [TEST])
    assert settled is not None and settled.held == {0: (1,)} and not settled.unstable
    varying = {TEST: [(0, [BUGGY_4]), (1, [7, 7, TRUE])]}  # the held site's answer varies between runs
    settled = settle(sites, first, varying, [TEST])
    assert settled is not None and settled.held == {} and (TEST, 0) in settled.unstable
    broke = {TEST: [(0, [GOLD_5]), (1, [7, 8, {"!truth": False}])]}  # leaving Money(5) out changed a check
    assert settle(sites, first, broke, [TEST]) is None
    assert settle(full, first, first, [TEST]) is not None


def test_an_expected_value_kept_in_a_variable_is_not_computed_either():
    source = (
        "from m import Money, total\n\n\n"
        "def test_sum():\n"
        "    expected = Money(5, 'EUR')\n"
        "    other = Money(1, 'EUR')\n"
        "    assert total([2, 3]) == expected\n"
        "    assert total([1]) == other\n"
        "    assert other.amount == 1\n"
    )
    rewritten = probes.instrument({"tests/test_m.py": source}, {0: (1,), 1: (1,)}).files["tests/test_m.py"]
    assert "Money(5" not in rewritten  # read only by a held operand: the assignment is gone
    assert "other = Money(1" in rewritten  # read by another check too: it stays
    compile(rewritten, "test_m.py", "exec")
