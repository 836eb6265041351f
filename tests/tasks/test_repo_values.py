"""Pure rules of the values verdict for repo-v1 (tasks/repo/values.py) and of unittest's assert
methods as asserts (tasks/coding/assert_methods.py), without containers."""

from __future__ import annotations

import ast
import base64
import dataclasses
import json

from tasks.coding import probes
from tasks.coding.assert_methods import as_asserts
from tasks.coding.verdict import GradeResult, Reference
from tasks.repo import values
from tasks.repo.task import RepoTask
from tasks.repo.values import RepoReference, junit_only, reference_key, unrewritable, values_verdict
from tests.tasks.repo_forgery import _without


def _rewritten(source: str) -> str:
    return ast.unparse(as_asserts(ast.parse(source)))


def test_unittest_methods_that_mean_one_comparison_become_asserts():
    src = (
        "class T(TestCase):\n"
        "    def test(self):\n"
        "        self.assertEqual(f(1), [1, 2], 'msg')\n"
        "        self.assertNotIn(x, y)\n"
        "        self.assertIsNone(g(), msg='m')\n"
        "        self.assertFalse(h())\n"
        "        self.assertGreaterEqual(a, 3)\n"
    )
    lines = [line.strip() for line in _rewritten(src).splitlines()]
    assert [line for line in lines if line and not line.startswith(("class", "def"))] == [
        "assert f(1) == [1, 2]",
        "assert x not in y",
        "assert g() is None",
        "assert not h()",
        "assert a >= 3",
    ]


def test_assert_raises_becomes_a_pytest_raises_block_in_both_forms():
    src = (
        "def test(self):\n"
        "    with self.assertRaises(ValueError):\n"
        "        f()\n"
        "    self.assertRaises(KeyError, g, 1, key=2)\n"
        "    with self.assertRaisesRegex(TypeError, 'bad'):\n"
        "        h()\n"
    )
    out = _rewritten(src)
    assert "with pytest.raises(ValueError):\n        f()" in out
    assert "with pytest.raises(KeyError):\n        g(1, key=2)" in out
    assert "with pytest.raises(TypeError, match='bad'):\n        h()" in out


def test_methods_that_mean_more_than_a_comparison_stay():
    src = (
        "def test(self):\n"
        "    self.assertAlmostEqual(a, b)\n"
        "    self.assertCountEqual(a, b)\n"
        "    other.assertEqual(a, b)\n"
        "    self.assertEqual(*pair)\n"
        "    with self.assertRaises(E) as cm:\n"
        "        f()\n"
        "    self.assertRaises(E, f, msg='m')\n"
    )
    assert _rewritten(src) == ast.unparse(ast.parse(src))


def test_the_probes_drop_a_unittest_literal_from_the_container():
    out = probes.instrument(
        {"t.py": "class T:\n    def test_a(self):\n        self.assertEqual(f(2), 12345)\n"}
    )
    assert "12345" not in out.files["t.py"]
    (site,) = out.sites.values()
    assert site.kind == "compare" and site.literals == ((1, 12345),) and site.test == "t.py::T::test_a"


def test_unrewritable_says_why_or_none():
    assert unrewritable({"t.py": "def test_a():\n    assert f() == 1\n"}, []) is None
    assert "missing" in (unrewritable({}, ["t.py"]) or "")
    assert "does not parse" in (unrewritable({"t.py": "def test_a(:\n"}, []) or "")
    assert "no listed test file has an assert" in (
        unrewritable({"t.py": "def test_a():\n    f()\n"}, []) or ""
    )


def _task(**over: object) -> RepoTask:
    base = dict(id="t", instance_id="i", repo="o/r", base_commit="0" * 40, problem_statement="p",
                patch="gold", test_patch="tests", fail_to_pass=["t.py::test_a"], image="img")  # fmt: skip
    return RepoTask(**{**base, **over})  # type: ignore[arg-type]


def test_the_reference_key_follows_what_runs_not_the_names():
    key = reference_key(_task())
    assert reference_key(_task(id="other", instance_id="x", problem_statement="q")) == key
    for change in (
        {"patch": "gold2"},
        {"test_patch": "t2"},
        {"image": "img2"},
        {"pass_to_pass": ["t.py::b"]},
    ):
        assert reference_key(_task(**change)) != key


def _reference(gold: dict[str, list]) -> RepoReference:
    inst = probes.instrument({"t.py": "def test_a():\n    assert f() == 3\n\n\ndef test_b():\n    g()\n"})
    ref = Reference(inst.files, inst.sites, gold, set(), set())
    return RepoReference(ref, junit_only=junit_only(ref, ["t.py::test_a", "t.py::test_b"]))


def _report(record: list[tuple[str, int, list]]) -> dict:
    lines = "".join(json.dumps({"t": t, "s": s, "v": v}) + "\n" for t, s, v in record)
    return {"probes": base64.b64encode(lines.encode()).decode()}


def _junit(passed: bool) -> GradeResult:
    failed = {} if passed else {"t.py::test_b": "failed"}
    info = {"missing_tests": [], "failed_tests": failed, "passed": 2 - len(failed)}
    return GradeResult(1.0 if passed else 0.0, info)


def test_values_verdict_needs_both_junit_and_the_gold_values():
    ref = _reference({"t.py::test_a": [(0, [{"int": "3"}])]})
    assert ref.junit_only == ["t.py::test_b"]  # no check recorded: JUnit alone
    listed = ["t.py::test_a", "t.py::test_b"]
    right, wrong = _report([("t.py::test_a", 0, [3])]), _report([("t.py::test_a", 0, [4])])
    ok = values_verdict(_junit(True), ref, right, listed)
    assert ok.reward == 1.0 and ok.info["verdict"] == "values"
    forged = values_verdict(_junit(True), ref, wrong, listed)  # pytest said passed, the value is wrong
    assert forged.reward == 0.0 and forged.info["failed_tests"] == {"t.py::test_a": "failed"}
    assert values_verdict(_junit(False), ref, right, listed).reward == 0.0
    unread = values_verdict(_junit(True), ref, {"probes": base64.b64encode(b"not json\n").decode()}, listed)
    assert unread.reward == 0.0 and "malformed" in unread.info["held_out_failures"]["t.py::test_a"]


def test_without_a_reference_the_junit_verdict_stands_and_says_why():
    out = values_verdict(
        _junit(True), RepoReference(None, "the task has no gold patch"), {}, ["t.py::test_a"]
    )
    assert out.reward == 1.0 and out.info["verdict"] == "junit"
    assert out.info["verdict_fallback"] == "the task has no gold patch"


def test_a_verdict_without_outcomes_keeps_the_junit_reason():
    timed_out = GradeResult(0.0, {"reason": "the tests timed out"})
    out = values_verdict(timed_out, _reference({}), {}, ["t.py::test_a"])
    assert out.reward == 0.0 and out.info["reason"] == "the tests timed out"


def test_without_drops_only_the_named_top_level_classes():
    src = "import x\n\n\n@dec\nclass A:\n    pass\n\n\nclass B:\n    pass\n"
    assert _without(src, ["A"]) == "import x\n\n\n\n\nclass B:\n    pass\n"


def test_a_fail_to_pass_test_is_safe_only_if_values_catch_the_unfixed_code():
    inst = probes.instrument({"t.py": "def test_a():\n    assert f() == 3\n\n\ndef test_b():\n    g()\n"})
    gold = {"t.py::test_a": [(0, [{"int": "3"}]), (0, [1])]}

    def ref(fails, unstable=frozenset(), gold=gold) -> Reference:
        return Reference(inst.files, inst.sites, gold, set(unstable), set(), fails)

    assert values.unsafe_fail_to_pass(ref(frozenset({("t.py::test_a", 0)})), ["t.py::test_a"]) == {}
    why = {
        "the unfixed code records": ref(frozenset()),  # the bug shows only in pytest's outcome
        "no record": ref(None),
        "varies": ref(frozenset({("t.py::test_a", 1)}), unstable={("t.py::test_a", 1)}),
        "no stable, whole check": ref(frozenset(), gold={}),  # e.g. only assertAlmostEqual
    }
    for reason, r in why.items():
        out = values.unsafe_fail_to_pass(r, ["t.py::test_a"])
        assert list(out) == ["t.py::test_a"], reason
    unfixed = values.unsafe_fail_to_pass(ref(frozenset()), ["t.py::test_a"])
    assert "unfixed code records" in unfixed["t.py::test_a"]
    # the unfixed code differs only where the container computes the expectation too: forgeable
    computed = probes.instrument({"t.py": "def test_a():\n    assert f() == g()\n    assert f()\n"})
    fails = frozenset({("t.py::test_a", 0), ("t.py::test_a", 1)})
    gold2 = {"t.py::test_a": [(0, [1, 1, {"!truth": True}]), (1, [{"!truth": True}])]}
    forgeable = Reference(computed.files, computed.sites, gold2, set(), set(), fails)
    assert (
        "expectation the container computes"
        in values.unsafe_fail_to_pass(forgeable, ["t.py::test_a"])["t.py::test_a"]
    )
    whole = values.unsafe_fail_to_pass(None, ["t.py::test_a", "t.py::test_b"], "no gold record: it fails")
    assert whole == dict.fromkeys(["t.py::test_a", "t.py::test_b"], "no gold record: it fails")


def test_the_verdict_names_unsafe_fail_to_pass_tests_so_the_check_fails_the_task():
    listed = ["t.py::test_a", "t.py::test_b"]
    ref = dataclasses.replace(
        _reference({"t.py::test_a": [(0, [{"int": "3"}])]}), unsafe={"t.py::test_b": "x"}
    )
    out = values_verdict(_junit(True), ref, _report([("t.py::test_a", 0, [3])]), listed)
    assert out.info["unsafe_fail_to_pass"] == {"t.py::test_b": "x"}
    fallback = RepoReference(None, "why", unsafe={"t.py::test_a": "why"})
    assert values_verdict(_junit(True), fallback, {}, listed).info["unsafe_fail_to_pass"] == {
        "t.py::test_a": "why"
    }
    assert "unsafe_fail_to_pass" not in values_verdict(_junit(True), _reference({}), {}, listed).info


def test_a_check_against_true_false_or_none_is_one_guess_away_so_it_does_not_make_a_test_safe():
    for expected, safe in (("True", False), ("None", False), ("False", False), ("3", True), ("'ok'", True)):
        inst = probes.instrument({"t.py": f"def test_a():\n    assert f() == {expected}\n"})
        gold = {"t.py::test_a": [(0, [{"int": "1"}])]}
        ref = Reference(inst.files, inst.sites, gold, set(), set(), frozenset({("t.py::test_a", 0)}))
        out = values.unsafe_fail_to_pass(ref, ["t.py::test_a"])
        assert (out == {}) is safe, (expected, out)


def test_checks_the_unfixed_code_never_reached_are_no_evidence():
    from tasks.coding.held import base_fails

    gold = {"t.py::test_a": [(0, [True]), (1, ["1.0"])]}
    # the unfixed code stopped at check 0 (or never imported): check 1 may not depend on the bug
    assert base_fails(gold, {"t.py::test_a": [(0, [False])]}) == {("t.py::test_a", 0)}
    assert base_fails(gold, {}) == frozenset()
    # it went another way at check 0: neither position was reached as the gold reached it
    assert base_fails(gold, {"t.py::test_a": [(7, [1]), (1, ["2.0"])]}) == frozenset()
    assert base_fails(gold, {"t.py::test_a": [(0, [True]), (1, ["2.0"])]}) == {("t.py::test_a", 1)}


def test_a_reference_lost_to_the_machine_is_an_infra_failure_then_retires_the_task(monkeypatch):
    import asyncio

    from tasks.coding.reference import GoldReferenceError
    from tasks.repo import grading

    calls = []

    async def lost(task, make_sandbox, timeout):  # what a dying sandbox or a timed-out gold returns
        calls.append(task.id)
        await asyncio.sleep(0.01)
        return RepoReference(None, "no gold record: the gold's run timed out", cached=False)

    monkeypatch.setattr(grading, "_compute_reference", lost)
    monkeypatch.setattr(grading, "REFERENCE_BACKOFF_S", 0.2)

    async def group(n: int) -> list[BaseException | RepoReference]:
        """A group's gradings of one task, at once."""
        return await asyncio.gather(
            *(grading.reference(_task(id="lost"), None, 10.0) for _ in range(n)),  # type: ignore[arg-type]
            return_exceptions=True,
        )

    for n in range(1, grading.MAX_REFERENCE_TRIES):
        got = asyncio.run(group(8))
        # one computation for the whole group; the seven queued behind it back off, none is graded
        assert len(calls) == n and all(isinstance(e, grading.ReferenceUnavailable) for e in got), got
        assert sum(f"try {n})" in str(e) for e in got) == 1, got
        asyncio.run(asyncio.sleep(0.25))  # the backoff passes
    got = asyncio.run(group(8))
    assert len(calls) == grading.MAX_REFERENCE_TRIES
    retired = [e for e in got if isinstance(e, GoldReferenceError)]
    assert len(retired) == 1 and f"in {grading.MAX_REFERENCE_TRIES} tries" in str(retired[0]), got
    assert all("backing off" in str(e) for e in got if e not in retired), got
    asyncio.run(asyncio.sleep(0.25))
    got = asyncio.run(group(1))  # the count starts again
    assert "try 1)" in str(got[0]), got
