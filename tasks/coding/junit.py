"""JUnit XML reports from pytest, parsed on the host into per-test outcomes keyed by pytest node id.

The report is untrusted input (the code under test ran in the process that wrote it), so parsing
is strict: a size cap, no DTD or entities (pytest never writes them), one well-formed document
(a second document appended by an exit hook makes it malformed), and the counts each
``<testsuite>`` claims must match the test cases it holds.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["MAX_REPORT_BYTES", "ReportError", "TestOutcome", "node_id", "parse_junit"]

MAX_REPORT_BYTES = 2 << 20
Outcome = Literal["passed", "failed", "error", "skipped"]
_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}  # a test reported twice keeps the worst


class ReportError(ValueError):
    """The report is missing, malformed or inconsistent: it cannot be trusted."""


@dataclass(frozen=True)
class TestOutcome:
    """One test's result: its pytest node id, outcome, and the failure message and traceback."""

    __test__ = False  # not a pytest test class

    id: str
    outcome: Outcome
    message: str = ""
    text: str = ""


def node_id(classname: str, name: str, test_files: Iterable[str]) -> str:
    """``tests.test_x.TestY`` + ``test_z`` -> ``tests/test_x.py::TestY::test_z``.

    pytest writes the node id's path with "/" turned into "." and ".py" dropped, so the file is
    found by matching against the known test files (longest first). An unknown class name gives
    ``?classname::name``, which matches no expected id.
    """
    for path in sorted(test_files, key=len, reverse=True):
        dotted = path.removesuffix(".py").replace("/", ".")
        if classname == dotted:
            return f"{path}::{name}"
        if classname.startswith(dotted + "."):
            classes = classname[len(dotted) + 1 :].replace(".", "::")
            return f"{path}::{classes}::{name}"
    return f"?{classname}::{name}"


def _outcome(case: ET.Element) -> tuple[Outcome, str, str]:
    for tag, outcome in (("error", "error"), ("failure", "failed"), ("skipped", "skipped")):
        child = case.find(tag)
        if child is not None:
            return outcome, child.get("message", ""), child.text or ""  # type: ignore[return-value]
    return "passed", "", ""


def _int(suite: ET.Element, attr: str) -> int:
    try:
        return int(suite.get(attr, "0"))
    except ValueError:
        raise ReportError(
            f"testsuite attribute {attr}={suite.get(attr, '')[:50]!r} is not an integer"
        ) from None


def parse_junit(xml: bytes, test_files: Iterable[str]) -> list[TestOutcome]:
    """Per-test outcomes in report order (a test reported twice appears once, with its worst outcome).

    Raises:
        ReportError: the report is empty, too large, not one well-formed document, declares a DTD
            or entities, or its counts disagree with its test cases.
    """
    if not xml.strip():
        raise ReportError("the report is empty")
    if len(xml) > MAX_REPORT_BYTES:
        raise ReportError(f"the report is larger than {MAX_REPORT_BYTES} bytes")
    if re.search(rb"<!(DOCTYPE|ENTITY)", xml, re.IGNORECASE):
        raise ReportError("the report declares a DTD or entities")
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as e:
        raise ReportError(f"the report is not one well-formed XML document: {e}") from None
    suites = [root] if root.tag == "testsuite" else list(root) if root.tag == "testsuites" else None
    if not suites or any(s.tag != "testsuite" for s in suites):
        raise ReportError(f"unexpected report structure (root <{root.tag[:50]}>)")
    files = list(test_files)
    found: dict[str, TestOutcome] = {}
    for suite in suites:
        cases = suite.findall("testcase")
        outcomes = [_outcome(c) for c in cases]
        for attr, kind in (("failures", "failed"), ("skipped", "skipped")):
            claimed, counted = _int(suite, attr), sum(o[0] == kind for o in outcomes)
            if claimed != counted:
                raise ReportError(f"testsuite claims {attr}={claimed} but holds {counted}")
        if _int(suite, "tests") > len(cases):
            raise ReportError(f"testsuite claims tests={_int(suite, 'tests')} but holds {len(cases)}")
        for case, (outcome, message, text) in zip(cases, outcomes, strict=True):
            tid = node_id(case.get("classname", ""), case.get("name", ""), files)
            old = found.get(tid)
            if old is None or _RANK[outcome] > _RANK[old.outcome]:
                found[tid] = TestOutcome(tid, outcome, message, text)
    return list(found.values())
