"""What repo-v1 tells a user about a task it cannot grade, as pure functions: test ids that are not
pytest node ids, a listed id absent from a test file that ran (not found, not failed), git's own
error for a patch that does not apply, and --check's lines (the reward's reason first, the gold's
failure once, the way forward for tests the verdict cannot judge)."""

from __future__ import annotations

import base64

import pytest
from pydantic import ValidationError

from env_server.conformance import unsafe_line, worked_problems
from sandboxes.repo_source import git_error
from tasks.repo.grading import judge
from tasks.repo.sample import sample_task
from tasks.repo.task import RepoTask, not_node_id


@pytest.mark.parametrize(
    "test",
    [
        "test_clamp_high (tests.test_clamp.TestClamp)",
        "test_clamp",
        "tests/test_clamp.py",
        "t.py::",
        "::t",
        "tests.test_clamp::TestClamp::test_high",
        "tests/test_clamp::test_high",
    ],  # fmt: skip
)
def test_an_id_that_is_not_a_pytest_node_id_is_refused(test):
    assert "is not a pytest node id" in (not_node_id(test) or "")
    with pytest.raises(ValidationError, match=r"fail_to_pass: test id .* needs ids path::name"):
        RepoTask.model_validate({**sample_task(), "fail_to_pass": [test]})
    with pytest.raises(ValidationError, match="pass_to_pass: test id"):
        RepoTask.model_validate({**sample_task(), "pass_to_pass": [test]})
    with pytest.raises(ValidationError, match="fail_to_pass: test id"):  # the grader reads JUnit anyway
        RepoTask.model_validate({**sample_task(), "fail_to_pass": [test], "test_command": "./runtests.py"})


def test_node_ids_and_pytest_commands_are_recognised():
    assert not_node_id("tests/test_x.py::TestX::test_y[a b]") is None
    assert not_node_id("test_x.py::test_y") is None and not_node_id("docs/index.rst::index.rst") is None
    cut = "astropy/units/tests/test_format.py::test_ogip_grammar_fail[log(photon"  # cut at a space
    assert "cut short" in (not_node_id(cut) or "")
    assert not_node_id("t.py::test_y[a::b]") is None and not_node_id("t.py::C::test[x-1]") is None


def _report(cases: dict[str, str]) -> dict[str, object]:
    body = ""
    for node, outcome in cases.items():
        path, name = node.split("::")
        cls = path.removesuffix(".py").replace("/", ".")
        inner = "" if outcome == "passed" else '<failure message="boom">boom</failure>'
        body += f'<testcase classname="{cls}" name="{name}" time="0.01">{inner}</testcase>'
    counts = f'tests="{len(cases)}" failures="{sum(o != "passed" for o in cases.values())}" errors="0"'
    xml = f'<testsuites><testsuite name="pytest" {counts}>{body}</testsuite></testsuites>'
    return {"xml": base64.b64encode(xml.encode()).decode()}


def test_a_listed_id_absent_from_a_file_that_ran_is_not_found_not_failed():
    task = RepoTask.model_validate({
        **sample_task(),
        "fail_to_pass": ["tests/test_calc.py::test_clamp_hi", "tests/test_calc.py::test_add"],
        "pass_to_pass": ["tests/test_other.py::test_x"],
    })  # fmt: skip
    result = judge(
        task, _report({"tests/test_calc.py::test_add": "passed", "tests/test_calc.py::test_b": "passed"})
    )
    reason = result.info["reason"]
    assert result.reward == 0.0 and result.info["not_found_tests"] == ["tests/test_calc.py::test_clamp_hi"]
    assert "1 listed test(s) not found in their test files (missing, not failed" in reason, reason
    assert "1 listed test(s) did not pass: ['tests/test_other.py::test_x']" in reason, (
        reason
    )  # its file never ran
    ran = {"tests/test_calc.py::test_add": "failed", "tests/test_calc.py::test_clamp_hi": "passed"}
    failed = judge(task, _report({**ran, "tests/test_other.py::test_x": "passed"}))
    assert failed.info["reason"] == "1 listed test(s) did not pass: ['tests/test_calc.py::test_add']"
    assert "not_found_tests" not in failed.info


def test_git_error_is_the_line_that_says_what_went_wrong():
    out = "Checking patch src/tinycalc/ops.py...\nerror: patch failed: src/tinycalc/ops.py:9\n"
    out += "error: src/tinycalc/ops.py: patch does not apply\n"
    assert git_error(out) == "error: patch failed: src/tinycalc/ops.py:9"
    assert git_error("fatal: corrupt patch at line 4\n") == "fatal: corrupt patch at line 4"
    assert git_error("something odd\n\n") == "something odd" and git_error("") == "git gave no reason"


def test_check_says_the_rewards_reason_first_and_the_gold_failure_once():
    banner = "===== test session starts ====\nplatform linux"
    worked = worked_problems(
        0.0, {"output_tail": banner, "reason": "1 listed test(s) did not pass: ['t.py::a']"}
    )
    assert worked == ["the correct episode earned 0, not 1: 1 listed test(s) did not pass: ['t.py::a']"]
    gold = "no gold record: task x: the gold patch does not apply: error: patch failed: src/tinycalc/ops.py:9"
    info = {"output_tail": banner, "reason": "1 listed test(s) did not pass", "verdict_fallback": gold,
            "unsafe_fail_to_pass": {"t.py::a": gold, "t.py::b": gold}}  # fmt: skip
    assert worked_problems(0.0, info) == [
        "the gold solution: the gold patch does not apply: error: patch failed: src/tinycalc/ops.py:9"
    ]
    assert worked_problems(1.0, {"reason": "every listed test passed"}) == []


def test_the_unsafe_line_names_the_tests_once_and_the_way_forward():
    line = unsafe_line(
        {f"t.py::t{i}": "it recorded no stable, whole check on the gold solution" for i in range(5)}
    )
    assert line.startswith(
        "FAIL_TO_PASS tests the verdict cannot judge safely (t.py::t0, t.py::t1, t.py::t2 and 2 more)"
    )
    assert line.count("it recorded no stable") == 1 and '{"verdict": "junit"}' in line and "forge" in line
    assert "\n" not in line


def test_a_build_failure_keeps_the_commands_error_and_says_when_it_found_no_network():
    from tasks.harbor.importer import build_failure

    out = "docker build -q ... failed (100): DEPRECATED: The legacy builder is deprecated\n"
    out += (
        "\x1b[91mE: Failed to fetch http://deb.debian.org/x  Temporary failure resolving 'deb.debian.org'\n"
    )
    out += "\x1b[0mRemoving intermediate container 1234\nThe command '/bin/sh -c apt-get install -y x' "
    out += "returned a non-zero code: 100"
    line = build_failure(out)
    assert "Temporary failure resolving" in line and line.endswith(
        "environment/ or start FROM a local image that has it)"
    )
    assert "\n" not in line and "\x1b" not in line and "Removing" not in line and "DEPRECATED" not in line
    many = build_failure("\n".join(f"line {i}" for i in range(30)))
    assert many == " | ".join(f"line {i}" for i in range(20, 30))  # the last ten
