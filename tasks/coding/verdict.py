"""The verdict: the runner's report (and the probe record in it) turned into the reward.

Pure functions of what the grading container handed back and what the host kept, so every rule is
tested without containers. tasks/coding/grader.py says how the report is produced and why the
record, not pytest's word, decides.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from tasks.coding import probes
from tasks.coding.junit import ReportError, parse_junit
from tasks.coding.record import Record
from tasks.suite import CodingTask

__all__ = ["GradeResult", "Reference", "held_out_failures", "judge"]


@dataclass(frozen=True)
class GradeResult:
    reward: float
    info: dict[str, Any]


@dataclass(frozen=True)
class Reference:
    """What the host keeps about a task's rewritten tests: the files sent into the container, the
    sites (with the expectations that never leave the host) and the gold record; ``base_fails``:
    the gold entries the unfixed repository does not reproduce (the checks a forger must forge;
    None when the unfixed code left no record)."""

    files: dict[str, str]
    sites: dict[int, probes.Site]
    gold: Record
    unstable: set[tuple[str, int]]
    unstable_tests: set[str]
    base_fails: frozenset[tuple[str, int]] | None = None


def held_out_failures(reference: Reference, report: dict[str, Any], tests: list[str]) -> dict[str, str]:
    """Test id -> why its probe record differs from the gold one (every test, if the record is
    unreadable)."""
    if report.get("probes_overflow"):
        return dict.fromkeys(tests, "the probe record is larger than the runner keeps")
    try:
        record = probes.parse_record(base64.b64decode(report.get("probes", "")))
    except ValueError as e:  # written into by something other than the probes
        return dict.fromkeys(tests, f"the probe record is malformed: {str(e)[:200]}")
    judged = [t for t in tests if t not in reference.unstable_tests]
    return probes.compare(reference.gold, record, reference.sites, judged, reference.unstable)


def judge(
    task: CodingTask, report: dict[str, Any], canary: str, reference: Reference | None = None
) -> GradeResult:
    """Turns the runner's report into the reward: pure, so it is tested without containers. With
    a ``reference`` the tests ran rewritten (tasks/coding/probes.py) and a test passes only if
    pytest passed it *and* its probe record matches the gold one."""
    info: dict[str, Any] = {"exit_code": report.get("exit_code"), "tampered": False, "tamper_reasons": []}
    integrity: list[str] = info["tamper_reasons"]
    if report.get("leftover_processes"):
        integrity.append(f"{report['leftover_processes']} process(es) outlived pytest")
    if report.get("pipe_open"):
        integrity.append("the report pipe was still open after pytest exited")
    xml = base64.b64decode(report.get("xml", ""))
    exit_code = report.get("exit_code")
    killed = bool(report.get("timed_out")) or not isinstance(exit_code, int) or exit_code < 0
    finished = not killed and exit_code in (0, 1)  # pytest says it ran every test it collected
    try:
        if report.get("xml_overflow"):
            raise ReportError("the report is larger than the runner keeps")
        outcomes = parse_junit(xml, list(task.hidden_tests))
    except ReportError as e:
        outcomes = []
        info["report_error"] = str(e)
        # pytest writes one whole document unless it is killed first: a malformed or doubled one,
        # or none after a normal finish, was written (or withheld) by something else.
        if not killed and (xml.strip() or finished):
            integrity.append(f"report: {e}")
    by_id = {o.id: o.outcome for o in outcomes}
    canaries = {k: v for k, v in by_id.items() if f"test_{canary}_" in k}
    tests = {k: v for k, v in by_id.items() if k not in canaries}
    if outcomes and finished:
        for kind, want in (("pass", "passed"), ("fail", "failed")):
            got = next((v for k, v in canaries.items() if k.endswith(f"_must_{kind}")), "missing")
            if got != want:
                integrity.append(f"canary that must {kind} was {got}")
    if exit_code == 0:
        integrity.append("pytest exited 0 although a canary test fails")
    expected = set(task.fail_to_pass) | set(task.pass_to_pass)
    if reference is not None and outcomes:
        failures = held_out_failures(reference, report, sorted(expected))
        info["held_out_failures"] = dict(list(failures.items())[:50])
        tests.update({t: "failed" for t in failures if tests.get(t) == "passed"})
    missing = sorted(expected - set(tests))
    unexpected = sorted(set(tests) - expected)
    info["tests"] = {t: tests.get(t, "missing") for t in sorted(expected | set(tests))}
    for group, ids in (("fail_to_pass", task.fail_to_pass), ("pass_to_pass", task.pass_to_pass)):
        info[group] = {"passed": sum(tests.get(t) == "passed" for t in ids), "total": len(ids)}
    info["missing"], info["unexpected"] = missing, unexpected
    info["duration_s"] = report.get("duration_s")
    info["output_tail"] = str(report.get("output_tail", ""))[-2000:]  # untrusted: for people only
    if integrity:
        info["tampered"] = True
        reason = "integrity check failed: " + "; ".join(integrity)
    elif report.get("timed_out"):
        reason = "the tests timed out"
    elif not outcomes:
        reason = f"no test report ({info.get('report_error', 'pytest exit status ' + str(exit_code))})"
    elif exit_code != 1:
        reason = f"pytest exited with status {exit_code} (2: interrupted, e.g. by an import error)"
    elif missing or unexpected:
        reason = f"test ids differ from the task's: {len(missing)} missing, {len(unexpected)} unexpected"
    elif any(v != "passed" for v in tests.values()):
        failed = sum(v != "passed" for v in tests.values())
        reason = f"{failed} of {len(tests)} tests did not pass"
    else:
        return GradeResult(1.0, {**info, "reason": f"all {len(tests)} tests passed"})
    return GradeResult(0.0, {**info, "reason": reason})
