"""repo-v1 judged by values: the pure half (what falls back to JUnit, the cache key, the verdict).

The listed tests run inside the process that imports the submission, so the submission can rewrite
that process's verdict (an object equal to everything, a pytest hook rewriting reports, a crash).
As in coding-v1 (tasks/coding/grader.py), the test files the listed ids name are rewritten on the
host (tasks/coding/probes.py): their asserts become probes recording the values the code computed,
literals and held operands (tasks/coding/held.py) stay on the host, and the record is compared with
the gold solution's (tasks/coding/verdict.py). tasks/repo/grading.py runs the reference (the
unfixed base, then the gold patch, in fresh containers, once per task content) and the submission.

Judged by JUnit alone (``verdict: "junit"`` in the reward's info, with ``verdict_fallback``): a task
without a gold patch, one whose listed test files do not parse or hold no assert the probes rewrite,
one whose gold patch does not pass its own rewritten tests, one where no listed test recorded a
check on the gold solution (ids that are not pytest's node ids), and repo-v1 configured with
``verdict: junit``. With ``verdict: "values"``, a listed test that recorded no check on the gold
solution or whose record varies or was cut at its size limit (``junit_only_tests``: e.g. one
checked by a project's own assert helper or by ``assertAlmostEqual``) is judged by JUnit alone.

A test judged by its outcome alone can be forged (a pytest hook rewriting reports). That is safe
for a PASS_TO_PASS test (the unfixed code passes it anyway) and for a FAIL_TO_PASS test only if
another check stops a submission that leaves the bug: so every FAIL_TO_PASS test must be judged by
values, and the unfixed code's record must differ from the gold's in it at an ``==`` check the
unfixed code reached, whose expected side stays on the host (a literal, a held operand) and is not
True, False or None: elsewhere the container can compute or guess what to record, and a check the
unfixed code never reached may not depend on the bug at all. Those that are not are
``unsafe_fail_to_pass`` in the reward's info (every one, when the task falls back whole); ``pqrl
tasks validate --check`` fails such a task and generation drops it, so it is left out before
training rather than graded weakly.

A reference that could not be computed for the machine's sake (a sandbox died, the gold's run hit
its timeout) never downgrades a grading to JUnit: the episode fails as infrastructure and the next
grading computes it again; after ``MAX_REFERENCE_TRIES`` such failures in a row the task is retired
as a bad task, with the cause.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from tasks.coding import probes
from tasks.coding.verdict import GradeResult, Reference, held_out_failures
from tasks.repo.task import RepoTask

__all__ = [
    "RepoReference",
    "junit_only",
    "not_passed",
    "reference_key",
    "unrewritable",
    "unsafe_fail_to_pass",
    "values_verdict",
]


@dataclass(frozen=True)
class RepoReference:
    """What the host keeps for a task: the probe reference, or why there is none (JUnit decides)."""

    reference: Reference | None
    why_junit: str = ""
    junit_only: list[str] = field(default_factory=list)
    cached: bool = True  # False: computed again for the next grading
    unsafe: dict[str, str] = field(default_factory=dict)  # FAIL_TO_PASS test -> why values miss it


def reference_key(task: RepoTask) -> str:
    """The cache key of a task's reference: the rewriting scheme and every field that changes
    what runs (not the id, the issue text or the source dataset's name)."""
    fields = task.model_dump(exclude={"id", "instance_id", "problem_statement"})
    blob = json.dumps([probes.SCHEME, fields], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def unrewritable(hidden: dict[str, str], missing: list[str]) -> str | None:
    """Why the listed tests' files cannot be judged by values (None: they can)."""
    if missing:
        return f"a listed test file is missing after the test patch, or not UTF-8: {missing[0]}"
    for path, source in sorted(hidden.items()):
        try:
            compile(source, path, "exec", dont_inherit=True, flags=0x400)  # ast.PyCF_ONLY_AST
        except (SyntaxError, ValueError) as e:
            return f"a listed test file does not parse: {path}: {e}"
    if not probes.instrument(hidden).sites:
        return "no listed test file has an assert or pytest.raises the probes rewrite"
    return None


def junit_only(reference: Reference, listed: list[str]) -> list[str]:
    """Listed tests the gold solution recorded no check for (or whose checks vary by run in
    order): their JUnit outcome alone decides."""
    return [t for t in listed if not reference.gold.get(t) or t in reference.unstable_tests]


def unsafe_fail_to_pass(
    reference: Reference | None, fail_to_pass: list[str], why: str = ""
) -> dict[str, str]:
    """FAIL_TO_PASS tests a forged outcome could pass (see the module docstring) -> why."""
    if reference is None:
        return dict.fromkeys(fail_to_pass, why or "the task is judged by JUnit alone")
    only = set(junit_only(reference, fail_to_pass))
    fails = reference.base_fails
    out = {}
    for t in fail_to_pass:
        if t in only:
            out[t] = "it recorded no stable, whole check on the gold solution"
        elif fails is None:
            out[t] = "the unfixed code left no record to compare"
        elif not any(test == t and (test, i) not in reference.unstable for test, i in fails):
            out[t] = "the unfixed code records the gold solution's values in it"
        elif not any(test == t and (test, i) not in reference.unstable and _hidden(reference, test, i)
                     for test, i in fails):  # fmt: skip
            out[t] = "the unfixed code differs only at checks whose expectation the container computes"
    return out


def _hidden(reference: Reference, test: str, i: int) -> bool:
    """Whether the gold entry ``i`` of ``test`` is an ``==`` check whose expected side only the host
    holds (a dropped literal, a held operand) and is not a boolean or None. At any other check
    (``assert x``, ``!=``, ``<``, ``a == g(b)`` with ``g`` run in the container) code that takes
    over the test process can compute or guess what to record, so a difference there does not stop
    a submission that leaves the bug in place."""
    entries = reference.gold.get(test) or []
    site = reference.sites.get(entries[i][0]) if i < len(entries) else None
    if site is None or site.kind != "compare" or site.negated or set(site.ops) != {"=="}:
        return False
    values = entries[i][1]
    expected = [v for _, v in site.literals] + [values[j] for j in site.held if j < len(values)]
    # True, False and None are one guess away: code that forges `== True` need not see the test
    return any(not (v is None or isinstance(v, bool)) for v in expected)


def values_verdict(
    junit: GradeResult, ref: RepoReference, report: dict[str, Any], listed: list[str]
) -> GradeResult:
    """The JUnit verdict, then (with a reference) every listed test's probe record compared with
    the gold's: reward 1 only if both agree."""
    unsafe = {"unsafe_fail_to_pass": dict(list(ref.unsafe.items())[:50])} if ref.unsafe else {}
    if ref.reference is None:
        return GradeResult(
            junit.reward, {**junit.info, "verdict": "junit", "verdict_fallback": ref.why_junit, **unsafe}
        )
    failures = held_out_failures(ref.reference, report, listed)
    info: dict[str, Any] = {
        **junit.info,
        "verdict": "values",
        "junit_only_tests": ref.junit_only[:50],
        "held_out_failures": dict(list(failures.items())[:50]),
        **unsafe,
    }
    if "failed_tests" not in junit.info:  # no outcomes to judge (a timeout, an untrusted report)
        return GradeResult(junit.reward, info)
    missing = list(junit.info.get("missing_tests", []))
    failed = {**junit.info["failed_tests"]}
    failed.update({t: "failed" for t in failures if t not in failed and t not in missing})
    info.update(failed_tests=failed, passed=len(listed) - len(missing) - len(failed))
    if missing or failed:
        reason = not_passed(list(failed), missing, junit.info.get("not_found_tests", []))
        return GradeResult(0.0, {**info, "reason": reason})
    return GradeResult(1.0, {**info, "reason": "every listed test passed, with the correct code's values"})


def not_passed(failed: list[str], missing: list[str], not_found: list[str]) -> str:
    """The reason of a 0 for listed tests that failed or are missing from the report; those
    ``not_found`` (absent from a test file that ran) are named apart: a wrong id, not a failure."""
    unrun = [t for t in missing if t not in not_found]
    absent = [t for t in missing if t in not_found]
    parts = (
        [f"{len(failed) + len(unrun)} listed test(s) did not pass: {[*failed, *unrun][:5]}"]
        if failed or unrun
        else []
    )
    if absent:
        parts.append(
            f"{len(absent)} listed test(s) not found in their test files (missing, not failed; "
            f"check the ids against the test patch): {absent[:5]}"
        )
    return "; ".join(parts)
