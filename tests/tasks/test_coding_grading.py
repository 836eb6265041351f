"""The coding grader: diff filtering, JUnit parsing, the source policy and the verdict (pure), then
real gradings in Docker: every task's gold patch scores 1 and its empty and wrong solutions 0."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from sandboxes.docker import DockerSandbox, owner_id
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from tasks.coding.diffs import filter_patch, is_noise, is_protected, unified_diff
from tasks.coding.env import builtin_suite
from tasks.coding.grader import RUNNER_SOURCE, CodingGrader, _tar
from tasks.coding.junit import ReportError, node_id, parse_junit
from tasks.coding.policy import check_source
from tasks.coding.verdict import judge
from tasks.suite import CodingTask

RUN = "pytest-coding"
SETTINGS = SandboxSettings(memory_mb=512)
TASKS: list[CodingTask] = list(builtin_suite().tasks)  # type: ignore[arg-type]
TASK = builtin_suite().task("roman-03")
assert isinstance(TASK, CodingTask)

# ---------------------------------------------------------------- diffs


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        ("roman.py", False),
        ("pkg/util.py", False),
        ("README.md", False),
        ("tests/test_roman.py", True),
        ("tests/helpers.py", True),
        ("test_extra.py", True),
        ("roman_test.py", True),
        ("conftest.py", True),
        ("sub/conftest.py", True),
        ("evil.pth", True),
        ("sitecustomize.py", True),
        ("usercustomize.py", True),
        ("pytest.ini", True),
        ("tox.ini", True),
        ("setup.cfg", True),
        ("pyproject.toml", True),
        ("pytest_evil.py", True),
        ("evil-1.0.dist-info/entry_points.txt", True),
    ],
)
def test_protected_paths(path, protected):
    assert is_protected(path) is protected


def test_noise_is_caches_only():
    assert is_noise("__pycache__/roman.cpython-311.pyc") and is_noise(".pytest_cache/v/x")
    assert not is_noise("roman.py")


def test_filter_patch_keeps_source_hunks_and_drops_everything_else():
    patch = (
        unified_diff("roman.py", "a\n", "b\n")
        + unified_diff("tests/test_roman.py", "x\n", "y\n")
        + unified_diff("conftest.py", None, "import pytest\n")
        + unified_diff("helper.py", None, "z = 1\n")
        + "diff --git a/roman.py b/roman.py\nold mode 100644\nnew mode 100755\n"
        + "diff --git a/README.md b/roman.py\nsimilarity index 90%\n"
        + "rename from README.md\nrename to roman.py\n"
        + 'diff --git "a/\\303\\244.py" "b/\\303\\244.py"\n--- "a/\\303\\244.py"\n+++ "b/\\303\\244.py"\n'
        + "@@ -1 +1 @@\n-a\n+b\n"
    )
    kept, dropped = filter_patch(patch, ["roman.py"])
    assert kept == unified_diff("roman.py", "a\n", "b\n")
    assert {"tests/test_roman.py", "conftest.py", "helper.py", "roman.py"} <= set(dropped)


def test_a_part_whose_git_header_names_another_file_is_dropped():
    disguised = unified_diff("roman.py", "a\n", "b\n").replace(
        "a/roman.py b/roman.py", "a/conftest.py b/conftest.py"
    )
    assert filter_patch(disguised, ["roman.py"]) == ("", ["conftest.py", "roman.py"])


def test_a_removed_line_that_looks_like_a_file_header_stays_in_its_hunk():
    patch = unified_diff("roman.py", "-- x\n++ y\nz\n", "z\n")
    assert "--- x\n" in patch
    kept, dropped = filter_patch(patch, ["roman.py"])
    assert kept == patch and dropped == []


# ---------------------------------------------------------------- JUnit


def _xml(*cases: str, failures: int = 0, tests: int | None = None) -> bytes:
    n = len(cases) if tests is None else tests
    body = "".join(cases)
    return (
        f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" '
        f'failures="{failures}" skipped="0" tests="{n}">{body}</testsuite></testsuites>'
    ).encode()


PASS = '<testcase classname="tests.test_roman" name="test_a" time="0.1"/>'
FAIL = (
    '<testcase classname="tests.test_roman.TestX" name="test_b">'
    '<failure message="boom">tb</failure></testcase>'
)


def test_parse_junit_outcomes_and_node_ids():
    outcomes = parse_junit(_xml(PASS, FAIL, failures=1), ["tests/test_roman.py"])
    assert [(o.id, o.outcome, o.message) for o in outcomes] == [
        ("tests/test_roman.py::test_a", "passed", ""),
        ("tests/test_roman.py::TestX::test_b", "failed", "boom"),
    ]
    assert node_id("elsewhere.test_x", "test_y", ["tests/test_roman.py"]) == "?elsewhere.test_x::test_y"


def test_a_test_reported_twice_keeps_its_worst_outcome():
    err = (
        '<testcase classname="tests.test_roman" name="test_a"><error message="teardown">x</error></testcase>'
    )
    (outcome,) = parse_junit(_xml(PASS, err), ["tests/test_roman.py"])
    assert outcome.outcome == "error"


@pytest.mark.parametrize(
    ("xml", "problem"),
    [
        (b"", "empty"),
        (_xml(PASS) + _xml(PASS), "well-formed"),
        (b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "b">]><testsuites/>', "DTD"),
        (_xml(PASS, failures=1), "failures=1"),
        (_xml(PASS, tests=5), "tests=5"),
        (b"<html/>", "structure"),
    ],
)
def test_untrustworthy_reports_are_rejected(xml, problem):
    with pytest.raises(ReportError, match=problem):
        parse_junit(xml, ["tests/test_roman.py"])


# ---------------------------------------------------------------- source policy

ALLOWED = [
    "import math\nx = math.sqrt(2)\n",
    "from collections import OrderedDict\nd = OrderedDict()\n",
    "class A:\n    def __init__(self):\n        super().__init__()\n        self._x = 1\n",
    "def f(other):\n    return other._rows\n",
    "print('tests/test_roman.py::test_a PASSED')\n",
]
REJECTED = {
    "import os\nos._exit(0)\n": "import",
    "import sys\n": "import",
    "import atexit\n": "import",
    "import _pytest.python\n": "import",
    "import unittest\n": "import",
    "import builtins\n": "import",
    "from importlib import import_module\n": "import",
    "from re import *\n": "import",
    "from . import sibling\n": "import",
    "import re\nr = re\n": "import",
    "import re\nre.compile = None\n": "monkeypatch",
    "from collections import Counter\nCounter.most_common = None\n": "monkeypatch",
    "x = eval('1')\n": "builtin",
    "f = open('/tmp/x', 'w')\n": "builtin",
    "g = getattr(1, 'real')\n": "builtin",
    "raise SystemExit(0)\n": "builtin",
    "raise KeyboardInterrupt\n": "builtin",
    "t = ().__class__.__bases__\n": "introspection",
    "def f(e):\n    return e.tb_frame.f_globals\n": "introspection",
    "s = '{0.__class__}'.format(1)\n": "introspection",
    "b = __builtins__\n": "introspection",
    "x = f()._private\n": "introspection",
    "match x:\n    case object(__class__=c):\n        pass\n": "introspection",
    "d = dict(__class__=1)\n": "introspection",
    "class A:\n    __eq__ = lambda s, o: True\n": "introspection",
    "A = type('A', (), {})\n": "class",
    "class A(metaclass=type):\n    pass\n": "class",
    "class A:\n    def __eq__(self, other):\n        return True\n": "class",
    "class A:\n    def __getattr__(self, name):\n        return 1\n": "class",
    "# coding: rot13\nx = 1\n": "encoding",
    "def f(:\n": "syntax",
}


@pytest.mark.parametrize("source", ALLOWED)
def test_policy_allows_plain_code(source):
    assert check_source("m.py", source.encode(), b"class A:\n    def __init__(self):\n        pass\n") == []


@pytest.mark.parametrize(("source", "rule"), REJECTED.items())
def test_policy_rejects_escapes(source, rule):
    violations = check_source("m.py", source.encode(), b"")
    assert rule in {v.rule for v in violations}, violations


# ---------------------------------------------------------------- verdict (pure)

CANARY = "pqrl_0123456789ab"


def _report(cases: list[tuple[str, str]], exit_code: int = 1, **extra) -> dict:
    xml_cases = []
    for name, outcome in cases:
        cls = "x.canary" if CANARY in name else "tests.test_roman"
        inner = "<failure message='f'>tb</failure>" if outcome == "failed" else ""
        xml_cases.append(f'<testcase classname="{cls}" name="{name}">{inner}</testcase>')
    xml = _xml(*xml_cases, failures=sum(o == "failed" for _, o in cases))
    return {"xml": base64.b64encode(xml).decode(), "exit_code": exit_code, "leftover_processes": 0, **extra}


def _all(outcome: str = "passed", canaries: tuple[str, str] = ("passed", "failed")) -> list[tuple[str, str]]:
    ids = TASK.fail_to_pass + TASK.pass_to_pass
    return [(t.rsplit("::", 1)[1], outcome) for t in ids] + [
        (f"test_{CANARY}_must_pass", canaries[0]),
        (f"test_{CANARY}_must_fail", canaries[1]),
    ]


def test_judge_gives_one_only_for_the_exact_set_all_passing():
    good = judge(TASK, _report(_all()), CANARY)
    assert good.reward == 1.0 and not good.info["tampered"]
    assert good.info["fail_to_pass"] == {"passed": len(TASK.fail_to_pass), "total": len(TASK.fail_to_pass)}
    fewer = judge(TASK, _report(_all()[1:]), CANARY)
    assert fewer.reward == 0.0 and fewer.info["missing"]
    extra = judge(TASK, _report([*_all(), ("test_extra", "passed")]), CANARY)
    assert extra.reward == 0.0 and extra.info["unexpected"] == ["tests/test_roman.py::test_extra"]
    failing = judge(TASK, _report(_all("failed")), CANARY)
    assert failing.reward == 0.0 and not failing.info["tampered"]


@pytest.mark.parametrize(
    ("report", "reason"),
    [
        (_report(_all(canaries=("passed", "passed"))), "canary that must fail was passed"),
        (_report(_all(), exit_code=0), "pytest exited 0"),
        (_report(_all(), leftover_processes=2), "2 process(es) outlived pytest"),
        (_report(_all(), pipe_open=True), "pipe was still open"),
        ({"xml": "", "exit_code": 0}, "the report is empty"),
        ({"xml": base64.b64encode(_xml(PASS) * 2).decode(), "exit_code": 1}, "well-formed"),
    ],
)
def test_judge_flags_integrity_failures(report, reason):
    result = judge(TASK, report, CANARY)
    assert result.reward == 0.0 and result.info["tampered"]
    assert reason in result.info["reason"]


def test_judge_does_not_flag_honest_crashes():
    for report in ({"xml": "", "exit_code": -9}, {"xml": "", "exit_code": 2}, {"xml": "", "timed_out": True}):
        result = judge(TASK, report, CANARY)
        assert result.reward == 0.0 and not result.info["tampered"], result.info["reason"]


# ---------------------------------------------------------------- Docker


@pytest.fixture
async def docker_api() -> AsyncIterator[DockerAPI]:
    api = DockerAPI()
    yield api
    left = await api.list({"pqrl.run": RUN, "pqrl.owner": owner_id()})
    for c in left:
        with contextlib.suppress(Exception):
            await api.remove(c["Id"])
    await api.close()
    assert not left, f"containers left behind: {[c['Names'] for c in left]}"


def make_grader(api: DockerAPI, **kwargs) -> CodingGrader:
    async def make() -> DockerSandbox:
        return await DockerSandbox.create(api, SETTINGS, run=RUN)

    return CodingGrader(make, slots=asyncio.Semaphore(4), **kwargs)


async def test_gold_scores_one_and_empty_scores_zero_on_every_task(docker_api):
    grader = make_grader(docker_api)
    gold = await asyncio.gather(*(grader.grade_patch(t, t.gold_patch or "") for t in TASKS))
    empty = await asyncio.gather(*(grader.grade_patch(t, "") for t in TASKS))
    wrong_gold = {t.id: r.info["reason"] for t, r in zip(TASKS, gold, strict=True) if r.reward != 1.0}
    wrong_empty = {t.id: r.info["reason"] for t, r in zip(TASKS, empty, strict=True) if r.reward != 0.0}
    assert not wrong_gold and not wrong_empty
    assert all(not r.info["tampered"] and r.info["fail_to_pass"]["passed"] == 0 for r in empty)
    assert all(r.info["runner_dumpable_off"] for r in gold)


WRONG = [t for t in TASKS if t.id.endswith("-01")]


@pytest.mark.parametrize("task", WRONG, ids=[t.id for t in WRONG])
async def test_a_wrong_solution_scores_zero(docker_api, task):
    """Another bug of the same module: this task's bug is fixed, another one is introduced."""
    other = next(t for t in TASKS if t.id.split("-")[0] == task.id.split("-")[0] and t.id != task.id)
    (source,) = [p for p in task.repo if not p.startswith("tests/") and p.endswith(".py")]
    result = await make_grader(docker_api).grade_patch(
        task, unified_diff(source, task.repo[source], other.repo[source])
    )
    assert result.reward == 0.0 and not result.info["tampered"], result.info["reason"]
    assert result.info["fail_to_pass"]["passed"] + result.info["pass_to_pass"]["passed"] < len(
        result.info["tests"]
    )


async def test_a_patch_that_does_not_apply_scores_0_with_gits_error_in_the_reason(docker_api):
    stale = unified_diff("roman.py", "def nothing():\n    pass\n", "def nothing():\n    return 1\n")
    result = await make_grader(docker_api).grade_patch(TASK, stale)
    assert result.reward == 0.0 and result.info["reason"].startswith("the patch does not apply: error: ")
    assert "roman.py" in result.info["reason"] and "\n" not in result.info["reason"], result.info


async def test_an_endless_loop_times_out(docker_api):
    source = TASK.repo["roman.py"].replace(
        "    text = text.strip().upper()\n", "    while True:\n        pass\n"
    )
    result = await make_grader(docker_api, test_timeout=3).grade_patch(
        TASK, unified_diff("roman.py", TASK.repo["roman.py"], source)
    )
    assert result.reward == 0.0 and result.info["reason"] == "the tests timed out"
    assert not result.info["tampered"]


async def test_an_oversized_source_is_refused_not_run(docker_api):
    big = TASK.repo["roman.py"] + "# padding\n" * 40_000
    result = await make_grader(docker_api).grade_patch(
        TASK, unified_diff("roman.py", TASK.repo["roman.py"], big)
    )
    assert result.reward == 0.0 and result.info["tampered"]
    assert any(": size: " in v for v in result.info["policy_violations"])


PROBE = r"""
import os, subprocess
runner = os.getppid()
try:
    os.listdir(f"/proc/{runner}/fd")
    print("runner fds: readable")
except PermissionError:
    print("runner fds: refused")
subprocess.Popen(["setsid", "sleep", "60"])
"""


async def test_the_runner_hides_its_descriptors_kills_leftovers_and_refuses_a_planted_report(docker_api):
    sandbox = await DockerSandbox.create(docker_api, SETTINGS, run=RUN)
    try:
        await sandbox.upload(_tar({"runner.py": RUNNER_SOURCE}), "/tmp/g")
        config = {"argv": ["python3", "-c", PROBE], "cwd": "/tmp/g", "env": {"PATH": "/usr/bin:/bin"},
                  "timeout": 20, "report_dir": "/tmp/report"}  # fmt: skip
        run = ["python3", "-I", "-B", "/tmp/g/runner.py"]
        first = await sandbox.exec(run, stdin=json.dumps(config).encode(), timeout=40)
        assert first.ok, first.text()
        report = json.loads(await sandbox.read_file("/tmp/report/report.json"))
        assert report["dumpable_off"] and report["exit_code"] == 0
        assert "runner fds: refused" in report["output_tail"]
        assert report["leftover_processes"] >= 1, "the setsid'd sleep escaped the group and was killed"
        again = await sandbox.exec(run, stdin=json.dumps(config).encode(), timeout=40)
        assert again.exit_code == 3 and "already exists" in again.text()
    finally:
        await sandbox.close()


async def test_each_gold_run_has_a_container_of_its_own(docker_api):
    """A check on what differs from one container to the next (its host name) varies between the
    gold runs, so only its truth is judged: were both gold runs in one container, the value would
    look stable and every later grading (a fresh container) would fail it, the gold's included."""
    task = CodingTask(
        id="host-01",
        repo={"calc.py": "def add(a, b):\n    return a - b\n"},
        issue="add subtracts",
        hidden_tests={
            "tests/test_calc.py": "import socket\n\nfrom calc import add\n\n\n"
            "def test_add():\n    assert add(1, 2) == 3\n    assert socket.gethostname() != 'none'\n"
        },
        fail_to_pass=["tests/test_calc.py::test_add"],
        gold_patch=unified_diff(
            "calc.py", "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n"
        ),
    )
    grader = make_grader(docker_api)
    reference = await grader.reference(task)
    assert reference.unstable, "the host name looked the same in both gold runs"
    gold = await grader.grade_patch(task, task.gold_patch or "")
    assert gold.reward == 1.0, gold.info["reason"]
    assert (await grader.grade_patch(task, "")).reward == 0.0
