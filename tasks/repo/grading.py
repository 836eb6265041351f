"""Grading a ``repo`` task: the agent's diff and the hidden tests, in a fresh container of its image.

1. **Capture** (in the agent's sandbox): every change in ``/workspace`` against the base commit
   made at reset, tracked and untracked files alike, through a throwaway index (the agent's own
   index is left alone), as one ``git diff --binary``. Paths the ``test_patch`` touches and the
   test files the listed ids name are left out: the grader decides what those files hold.
2. **Apply** (in a fresh container of the task's image): the repository copied from
   ``repo_path``, the diff applied with ``git apply`` without those paths (one that does not
   apply scores 0, with git's complaint), then the ``test_patch``.
3. **Run**: the grader-owned runner (tasks/coding/runner.py) starts ``test_command`` on the test
   files the listed ids name, its JUnit XML into a pipe only the runner holds, bounded by a
   timeout, and kills what outlives it.
4. **Judge** (on the host): the report parsed strictly (tasks/coding/junit.py); reward 1 only if
   every id of FAIL_TO_PASS and PASS_TO_PASS is present and passed. A missing id is a failure;
   other tests are ignored. By default (``verdict="values"``) the listed test files run
   rewritten by the coding grader's probes and each listed test's record must also match the
   gold patch's (``reference``: computed once per task content; tasks/repo/values.py says what
   falls back to JUnit alone).

There is no source policy for this kind; what a reward of 1 guarantees is in docs/security.md.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import secrets
import shlex
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sandboxes.protocol import Sandbox, SandboxDied, SandboxError
from sandboxes.repo_source import git_error, glob_literal
from tasks.coding import probes
from tasks.coding.capture import WORKSPACE
from tasks.coding.diffs import split_patch
from tasks.coding.grader import PROBE_RUNTIME_SOURCE, RUNNER_SOURCE, _tar, grading_slots
from tasks.coding.junit import ReportError, parse_junit
from tasks.coding.record import Record
from tasks.coding.reference import GoldReferenceError, ast_work, build_reference, gold_runs_apart
from tasks.coding.verdict import GradeResult
from tasks.repo.task import RepoTask
from tasks.repo.values import (
    RepoReference,
    junit_only,
    not_passed,
    reference_key,
    unrewritable,
    unsafe_fail_to_pass,
    values_verdict,
)

__all__ = [
    "MAX_PATCH_BYTES",
    "MAX_REFERENCE_TRIES",
    "REFERENCE_BACKOFF_S",
    "ReferenceRetired",
    "ReferenceUnavailable",
    "capture_diff",
    "grade_patch",
    "graded_paths",
    "hidden_paths",
    "reference",
]

MAX_PATCH_BYTES = 8 << 20
_DIFF = ("diff", "--cached", "--binary", "--full-index", "--no-ext-diff", "--no-textconv", "--no-renames")


class Ungradable(Exception):
    """The workspace gives no diff (its git state is broken, the diff is too large): it scores 0."""


def hidden_paths(test_patch: str) -> list[str]:
    """Every path the test patch names: old and new names, renames and copies, git's quoted names
    unquoted."""
    paths: set[str] = set()
    for part in split_patch(test_patch):
        paths |= {p for p in (part.old_path, part.new_path, *part.git_paths) if p and "\0" not in p}
        for line in part.header + part.lines[:2]:
            for prefix, strip in _NAME_LINES:
                if line.startswith(prefix):
                    name = _unquoted(line[len(prefix) :].rstrip("\n"))
                    name = name[2:] if strip and name[:2] in ("a/", "b/") else name
                    if name != "/dev/null":
                        paths.add(name)
    return sorted(paths)


_NAME_LINES = (("--- ", True), ("+++ ", True), ("rename from ", False), ("rename to ", False),
               ("copy from ", False), ("copy to ", False))  # fmt: skip
_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}


def _unquoted(raw: str) -> str:
    """A name as git writes it in a patch: C-quoted (escapes, octal bytes) when it has special
    characters, else plain up to a tab."""
    if not raw.startswith('"'):
        return raw.split("\t", 1)[0]
    body, out, i = raw[1 : raw.rindex('"')] if raw.count('"') > 1 else raw[1:], bytearray(), 0
    while i < len(body):
        if body[i] == "\\" and body[i + 1 : i + 2] in _ESCAPES:
            out.append(_ESCAPES[body[i + 1]])
            i += 2
        elif body[i] == "\\" and len(body[i + 1 : i + 4]) == 3 and body[i + 1 : i + 4].isdigit():
            out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
            i += 4
        else:
            out += body[i].encode("utf-8", "surrogateescape")
            i += 1
    return out.decode("utf-8", "surrogateescape")


def graded_paths(task: RepoTask) -> list[str]:
    """Files the agent's diff may not change: every path the test patch names and every test file
    a listed id names (a PASS_TO_PASS test's file is as much the grader's as a hidden one)."""
    return sorted({*hidden_paths(task.test_patch), *_test_files(task)})


def _excludes(task: RepoTask) -> list[str]:
    return [".", *(f":(exclude,literal){p}" for p in graded_paths(task))]


async def capture_diff(sandbox: Sandbox, task: RepoTask, base_commit: str) -> bytes:
    """The agent's changes in ``/workspace`` against ``base_commit``, without the test patch's paths."""
    tag = secrets.token_hex(8)
    env = {"GIT_INDEX_FILE": f"/tmp/pqrl-index-{tag}", "GIT_OPTIONAL_LOCKS": "0"}
    out = f"/tmp/pqrl-diff-{tag}"
    excludes = _excludes(task)
    steps = (
        ["git", "read-tree", base_commit],
        ["git", "add", "-A", "--", *excludes],
        ["git", *_DIFF, f"--output={out}", base_commit, "--", *excludes],
    )
    for argv in steps:
        r = await sandbox.exec(argv, cwd=WORKSPACE, env=env, timeout=120)
        if not r.ok:
            raise Ungradable(f"`git {argv[1]}` failed in the workspace: {r.text()[-500:]}")
    try:
        return await sandbox.read_file(out, max_bytes=MAX_PATCH_BYTES)
    except ValueError:
        raise Ungradable(f"the diff is larger than {MAX_PATCH_BYTES} bytes") from None


async def grade_patch(
    task: RepoTask,
    patch: bytes,
    make_sandbox: Callable[[], Awaitable[Sandbox]],
    *,
    timeout: float,
    verdict: str = "values",
) -> GradeResult:
    """Grades ``patch`` (a git diff against the repository at ``repo_path``) in a fresh sandbox;
    ``verdict``: "values" (the probe record must match the gold's, tasks/repo/values.py) or
    "junit" (the listed tests' JUnit outcomes alone)."""
    t0 = time.monotonic()
    if verdict == "values":
        ref = await reference(task, make_sandbox, timeout)
    else:
        ref = RepoReference(None, "repo-v1 is configured with verdict: junit")
    async with grading_slots():
        sandbox = await make_sandbox()
        try:
            result = await _grade(task, patch, sandbox, timeout, ref)
        except SandboxDied as e:  # the submitted code took the container down (e.g. memory)
            result = GradeResult(0.0, {"reason": f"the grading sandbox died during the tests: {e}"})
        finally:
            await sandbox.close()
    result.info["grade_s"] = round(time.monotonic() - t0, 3)
    return result


async def _grade(
    task: RepoTask, patch: bytes, sandbox: Sandbox, timeout: float, ref: RepoReference
) -> GradeResult:
    gdir = f"/tmp/pqrl-grade-{secrets.token_hex(8)}"
    failed = await _checkout(task, patch, sandbox, gdir)
    if failed is not None:
        return failed
    files = ref.reference.files if ref.reference else None
    report = await _run_tests(task, sandbox, gdir, timeout, files)
    return values_verdict(judge(task, report), ref, report, _listed(task))


def _listed(task: RepoTask) -> list[str]:
    return sorted({*task.fail_to_pass, *task.pass_to_pass})


async def _checkout(
    task: RepoTask, patch: bytes, sandbox: Sandbox, gdir: str, label: str = "the patch"
) -> GradeResult | None:
    """The repository in ``sandbox``'s workspace with ``patch`` (``label`` in messages; less the
    graded paths) and the test patch applied; the 0 verdict, with git's error, when one does not apply."""
    copy = await sandbox.exec(["cp", "-a", f"{task.repo_path}/.", WORKSPACE], timeout=600)
    if not copy.ok:
        raise RuntimeError(f"copying {task.repo_path} into the grading sandbox failed: {copy.text()[-500:]}")
    await sandbox.upload(
        _tar({"agent.diff": patch, "tests.diff": task.test_patch, "runner.py": RUNNER_SOURCE}), gdir
    )
    # The diff came out of the agent's sandbox, whose git it controls: the hidden paths are left
    # out here again, by the grader's own git, which also names them (quoted names included).
    named = await sandbox.exec(["git", "apply", "--numstat", "-z", f"{gdir}/tests.diff"], cwd=WORKSPACE)
    if not named.ok:
        return _not_applied("the test patch cannot be read", named.text())
    names = {*_numstat_paths(named.stdout), *graded_paths(task)}  # numstat gives no old names
    hidden = [f"--exclude={glob_literal(p)}" for p in sorted(names)]
    for name, what, options in (("agent.diff", label, hidden), ("tests.diff", "the test patch", [])):
        if name == "agent.diff" and not patch.strip():
            continue
        argv = ["git", "apply", "--whitespace=nowarn", *options, f"{gdir}/{name}"]
        applied = await sandbox.exec(argv, cwd=WORKSPACE)
        if not applied.ok:
            return _not_applied(f"{what} does not apply", applied.text())
    return None


def _not_applied(what: str, output: str) -> GradeResult:
    """The 0 verdict of a patch git refused: ``what`` and git's first error in one line."""
    return GradeResult(0.0, {"reason": f"{what}: {git_error(output)}", "apply_error": output[-2000:]})


def _numstat_paths(out: bytes) -> list[str]:
    """The paths of ``git apply --numstat -z``: ``ADDED\tDELETED\tPATH\0`` per file, or for a
    rename or copy ``ADDED\tDELETED\t\0OLD\0NEW\0``."""
    paths, fields = [], out.decode("utf-8", "surrogateescape").split("\0")
    i = 0
    while i < len(fields):
        head = fields[i].split("\t", 2)
        if len(head) == 3 and head[2]:
            paths.append(head[2])
        elif len(head) == 3 and i + 2 < len(fields):  # a rename: the two names follow
            paths += fields[i + 1 : i + 3]
            i += 2
        i += 1
    return sorted(set(paths))


def _test_files(task: RepoTask) -> list[str]:
    return sorted({t.split("::", 1)[0] for t in (*task.fail_to_pass, *task.pass_to_pass)})


async def _run_tests(
    task: RepoTask, sandbox: Sandbox, gdir: str, timeout: float, files: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The runner's report of ``test_command`` on the files the ids name (those that exist: a
    missing file would stop pytest before any test ran; its ids then count as missing), with
    ``files`` (the rewritten tests) over them and the probes' recorder importable."""
    tests = _test_files(task)
    found = await sandbox.exec(
        ["sh", "-c", 'for f; do [ -e "$f" ] && printf "%s\\n" "$f"; done; true', "sh", *tests], cwd=WORKSPACE
    )
    present = found.stdout.decode("utf-8", "replace").splitlines()
    if not present:
        return {"xml": "", "missing_files": tests}
    env_out = await sandbox.exec(["env", "-0"], cwd=WORKSPACE)
    env = dict(kv.split("=", 1) for kv in env_out.stdout.decode("utf-8", "replace").split("\0") if "=" in kv)
    if files is not None:
        await sandbox.upload(_tar(files), WORKSPACE)
        await sandbox.upload(_tar({f"{probes.MODULE}.py": PROBE_RUNTIME_SOURCE}), f"{gdir}/lib")
        env["PYTHONPATH"] = ":".join(p for p in (f"{gdir}/lib", env.get("PYTHONPATH")) if p)
    # ids are relative to the repository's root, whatever pytest would take for its rootdir
    argv = [*shlex.split(task.test_command), f"--rootdir={WORKSPACE}", "--junitxml={junit}", *present]
    report_dir = f"{gdir}/report-{secrets.token_hex(8)}"  # the runner makes it: one per run
    config = {"argv": argv, "cwd": WORKSPACE, "env": env, "timeout": timeout, "report_dir": report_dir}
    run = await sandbox.exec(
        ["python3", "-I", "-B", f"{gdir}/runner.py"],
        cwd=gdir,
        stdin=json.dumps(config).encode(),
        timeout=timeout + 30,
    )
    if not run.ok:
        return {"xml": "", "runner_error": f"exit {run.exit_code}: {run.text()[-1000:]}"}
    report: dict[str, Any] = json.loads(
        await sandbox.read_file(f"{report_dir}/report.json", max_bytes=32 << 20)
    )
    return report


async def reference(
    task: RepoTask, make_sandbox: Callable[[], Awaitable[Sandbox]], timeout: float
) -> RepoReference:
    """The task's reference, computed once per process and task content (tasks/repo/values.py)."""
    if not task.patch:
        why = "the task has no gold patch"
        return RepoReference(None, why, unsafe=unsafe_fail_to_pass(None, task.fail_to_pass, why))
    key = reference_key(task)
    if key not in _REFERENCES:
        locks = _REFERENCE_LOCKS.setdefault(asyncio.get_running_loop(), {})
        async with locks.setdefault(key, asyncio.Lock()):  # one computation per task, across gradings
            if key not in _REFERENCES:
                lost = _TRANSIENT.get(key)
                if lost is not None and time.monotonic() - lost[1] < REFERENCE_BACKOFF_S:
                    # the gradings that queued behind a lost computation do not each run another
                    raise ReferenceUnavailable(f"task {task.id}: {lost[2]} (backing off after it)")
                computed = await _compute_reference(task, make_sandbox, timeout)
                unsafe = unsafe_fail_to_pass(computed.reference, task.fail_to_pass, computed.why_junit)
                computed = dataclasses.replace(computed, unsafe=unsafe)
                if not computed.cached:  # never graded by JUnit instead (tasks/repo/values.py)
                    tries = (lost[0] if lost else 0) + 1
                    _TRANSIENT[key] = (tries, time.monotonic(), computed.why_junit)
                    if tries >= MAX_REFERENCE_TRIES:
                        _TRANSIENT[key] = (0, time.monotonic(), computed.why_junit)  # counted anew
                        raise ReferenceRetired(
                            f"task {task.id}: no gold record in {tries} tries: {computed.why_junit}"
                        )
                    raise ReferenceUnavailable(f"task {task.id}: {computed.why_junit} (try {tries})")
                _TRANSIENT.pop(key, None)
                while len(_REFERENCES) >= MAX_REFERENCES:  # oldest first: a bounded cache
                    _REFERENCES.pop(next(iter(_REFERENCES)))
                _REFERENCES[key] = computed
    return _REFERENCES[key]


async def _compute_reference(
    task: RepoTask, make_sandbox: Callable[[], Awaitable[Sandbox]], timeout: float
) -> RepoReference:
    """The listed test files read from a checkout of the base with the test patch, then the
    reference runs (tasks/coding/reference.py): the base in that sandbox, the gold in another."""
    gdir, listed = f"/tmp/pqrl-grade-{secrets.token_hex(8)}", _listed(task)
    boxes: list[Sandbox] = []
    async with grading_slots():
        try:
            boxes.append(await make_sandbox())
            failed = await _checkout(task, b"", boxes[0], gdir)
            if failed is not None:
                return RepoReference(None, str(failed.info["reason"]))
            hidden, missing = await _read_tests(task, boxes[0])
            why = await ast_work(unrewritable, hidden, missing)
            if why:
                return RepoReference(None, why)

            async def run_base(files: Mapping[str, str]) -> Record | None:
                report = await _run_tests(task, boxes[0], gdir, min(timeout, 60.0), files)
                if "runner_error" in report:  # no run: no evidence (an empty record would be some)
                    return None
                try:
                    return probes.parse_record(base64.b64decode(report.get("probes", "")))
                except ValueError:  # the unfixed code's record is only evidence
                    return None

            async def gold_in(box: Sandbox, files: Mapping[str, str]) -> Record:
                here = f"/tmp/pqrl-grade-{secrets.token_hex(8)}"  # a grading folder of its own too
                gold = task.patch.encode() if task.patch else b""
                failed = await _checkout(task, gold, box, here, "the gold patch")
                if failed is not None:
                    raise GoldReferenceError(f"task {task.id}: {failed.info['reason']}")
                report = await _run_tests(task, box, here, timeout, files)
                verdict = judge(task, report)
                if verdict.reward != 1.0:
                    raise (_GoldTimedOut if report.get("timed_out") else GoldReferenceError)(
                        f"task {task.id}: the gold patch fails: {verdict.info['reason']}"
                    )
                if report.get("probes_overflow"):  # entries missing: every submission judged wrongly
                    raise GoldReferenceError(f"task {task.id}: the gold's probe record is larger than kept")
                return probes.parse_record(base64.b64decode(report.get("probes", "")))

            try:
                run_gold = gold_runs_apart(make_sandbox, gold_in)
                ref = await build_reference(task.id, hidden, listed, run_base, run_gold, always_base=True)
            except (
                SandboxDied,
                _GoldTimedOut,
            ) as e:  # the machine's fault (load), maybe not the gold's: not kept
                return RepoReference(None, f"no gold record: {str(e)[:500]}", cached=False)
            except (GoldReferenceError, ValueError) as e:  # BadRecord is a ValueError
                return RepoReference(None, f"no gold record: {str(e)[:500]}")
            only = junit_only(ref, listed)
            if len(only) == len(listed):  # e.g. ids that are not pytest's node ids: nothing to compare
                return RepoReference(None, "no listed test recorded a check on the gold solution")
            return RepoReference(ref, junit_only=only)
        finally:
            for box in boxes:
                await box.close()


class ReferenceUnavailable(SandboxError):
    """The task's reference could not be computed this time for the machine's sake: the episode
    is an infrastructure failure, never graded without it."""


class ReferenceRetired(GoldReferenceError):
    """The reference was lost to the machine too often: the task is retired from the run (a bad
    task to the env server), though nothing says the task itself is wrong."""

    lost_to_machine = True  # tasks/check.py: the task was not judged


class _GoldTimedOut(GoldReferenceError):
    """The gold's run reached the timeout: on a loaded machine, not the task's fault, so not kept."""


async def _read_tests(task: RepoTask, sandbox: Sandbox) -> tuple[dict[str, str], list[str]]:
    """The listed test files as the test patch left them (path -> text), and the missing ones."""
    hidden: dict[str, str] = {}
    missing: list[str] = []
    for path in _test_files(task):
        try:
            data = await sandbox.read_file(f"{WORKSPACE}/{path}", max_bytes=MAX_TEST_BYTES)
            hidden[path] = data.decode("utf-8")
        except (FileNotFoundError, IsADirectoryError, ValueError):  # ValueError: too large, not UTF-8
            missing.append(path)
    return hidden, missing


_REFERENCES: dict[str, RepoReference] = {}
MAX_REFERENCES, MAX_TEST_BYTES = 1024, 4 << 20
MAX_REFERENCE_TRIES = 3  # references lost to the machine in a row before the task is retired
REFERENCE_BACKOFF_S = 30.0  # after a lost one, the next computation waits this long at least
_TRANSIENT: dict[str, tuple[int, float, str]] = {}  # reference key -> (lost in a row, when, why)
_REFERENCE_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def judge(task: RepoTask, report: dict[str, Any]) -> GradeResult:
    """Reward 1 only if every listed id is in the report and passed."""
    info: dict[str, Any] = {"output_tail": str(report.get("output_tail", ""))[-2000:]}
    for key in (
        "missing_files",
        "runner_error",
        "exit_code",
        "duration_s",
        "leftover_processes",
        "pipe_open",
    ):
        if key in report:
            info[key] = report[key]
    if report.get("timed_out"):
        return GradeResult(0.0, {**info, "reason": "the tests timed out"})
    if report.get("xml_overflow"):
        return GradeResult(0.0, {**info, "reason": "the test report is too large"})
    listed = [*task.fail_to_pass, *task.pass_to_pass]
    xml = base64.b64decode(report.get("xml", "")) if report.get("xml") else b""
    try:
        outcomes = {o.id: o for o in parse_junit(xml, _test_files(task))} if xml.strip() else {}
    except ReportError as e:
        return GradeResult(0.0, {**info, "reason": f"the test report cannot be trusted: {e}"})
    missing = [t for t in listed if t not in outcomes]
    failed = {t: outcomes[t].outcome for t in listed if t in outcomes and outcomes[t].outcome != "passed"}
    ran = {o.split("::", 1)[0] for o in outcomes}  # a listed id absent from a file that ran: not found
    not_found = [t for t in missing if t.split("::", 1)[0] in ran]
    info.update(missing_tests=missing, failed_tests=failed, passed=len(listed) - len(missing) - len(failed))
    if not_found:
        info["not_found_tests"] = not_found
    if missing or failed:
        return GradeResult(0.0, {**info, "reason": not_passed(list(failed), missing, not_found)})
    return GradeResult(1.0, {**info, "reason": "every listed test passed"})
