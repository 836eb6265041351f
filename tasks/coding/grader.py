"""The coding grader: the source-only diff, applied in a fresh container, judged by hidden tests
whose expected values never enter that container.

For each submission (tasks/coding/capture.py says how it is taken from the agent's workspace):

1. a **fresh** container from the agent's image gets the pristine repository; the kept diff
   (task source files only) is applied there with ``git apply``;
2. the patched source files are read back and checked by the source policy (tasks/coding/policy.py)
   *before anything runs*: a patch that imports ``os``/``sys``/``atexit``/``_pytest``/
   ``unittest``/``builtins``, calls ``eval``/``open``/``getattr``, reaches for dunders or frames,
   or adds comparison dunders scores 0 and is flagged. This is a second layer that flags; the
   verdict below does not depend on it;
3. the hidden tests, rewritten on the host (tasks/coding/probes.py: asserts become probes that
   record the values the code computed; literals, polarities, exception types and messages stay on
   the host), are copied over the tests, and a grader-owned runner (tasks/coding/runner.py,
   uploaded after the check into a randomly named directory of the grader's) starts
   ``python -I -B -m pytest -c <grader ini> -p no:cacheprovider --noconftest`` with
   ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``, from that directory, on them plus two canary tests with
   per-run random names (one must pass, one must fail);
4. pytest writes its JUnit XML and the probes their record into pipes held by the runner, which is
   non-dumpable (no other process of the user can open its fds or ptrace it); after pytest exits
   the runner kills every leftover process, then creates a fresh, randomly named report directory
   and writes the report there. The host reads it through the sandbox API and judges it itself.

The reward is 1 only if the report is one well-formed document, the canaries came out as they
must, pytest's exit status is 1 (the failing canary), nothing outlived pytest, the set of test
ids equals FAIL_TO_PASS + PASS_TO_PASS exactly with every one passing, and (with a gold patch)
every test's probe record satisfies the original asserts on the host and follows the gold
solution's record (``CodingGrader.reference``: computed once per task and process, in a fresh
container: the rewritten tests on the unfixed repository, to learn which operands the fix changes
(tasks/coding/held.py), then twice on the gold solution, so values that vary between runs are
known). The verdict itself is tasks/coding/verdict.py.

Why the record and not pytest's word: code in the test process can rewrite that process's
verdict, whatever the policy missed (tests/tasks/test_coding_hacks.py plays such forgers with
the policy on and off). The record it can forge too, but a forged record scores only with the
values the correct code computes, which are not in the container. What this leaves open is
listed in tasks/coding/probes.py and docs/security.md: expectations a test carries outside its
asserts, an exception class guessed exactly (a ``pytest.raises`` record must equal the gold's
MRO), and solutions that special-case the hidden inputs. A task without a gold patch is judged by
pytest's outcomes alone.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import secrets
import tarfile
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from pqrl.envvars import setting
from sandboxes.docker import DockerSandbox
from sandboxes.protocol import Sandbox, SandboxDied
from sandboxes.repo_source import git_error
from tasks.coding import probes
from tasks.coding.capture import WORKSPACE, Submission, capture_workspace, submission_from_patch
from tasks.coding.diffs import source_files
from tasks.coding.policy import MAX_SOURCE_BYTES, Violation, check_source
from tasks.coding.record import Record, sendable
from tasks.coding.reference import GoldReferenceError, ast_work, build_reference, gold_runs_apart
from tasks.coding.verdict import GradeResult, Reference, judge
from tasks.suite import CodingTask

__all__ = ["CodingGrader", "GoldReferenceError", "GradeResult", "fresh_sandboxes", "grading_slots", "judge"]

RUNNER_SOURCE = (Path(__file__).parent / "runner.py").read_text()
PROBE_RUNTIME_SOURCE = (Path(__file__).parent / "probe_runtime.py").read_text()
_INI = (
    "[pytest]\naddopts =\npythonpath = {lib} {root}\njunit_family = xunit2\njunit_logging = no\n"
    "python_files = test_*.py\npython_classes = Test\npython_functions = test_*\n"
)
_CANARY = (
    "def test_{name}_must_pass():\n    assert 1 + 1 == 2\n\n\n"
    "def test_{name}_must_fail():\n    assert 1 + 1 == 3\n"
)
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def grading_slots(limit: int | None = None) -> asyncio.Semaphore:
    """The event loop's shared limit on concurrent gradings (``PQRL_GRADER_CONCURRENCY``, default 4).

    A grading costs a container and a pytest run (about a second of CPU); bounding them keeps a
    burst of finished episodes from starving the rollouts that share the machine. The first call
    on a loop fixes the limit.
    """
    loop = asyncio.get_running_loop()
    if loop not in _SLOTS:
        _SLOTS[loop] = asyncio.Semaphore(limit or int(setting("PQRL_GRADER_CONCURRENCY") or 4))
    return _SLOTS[loop]


def _tar(files: Mapping[str, str | bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, content in sorted(files.items()):
            data = content.encode() if isinstance(content, str) else content
            member = tarfile.TarInfo(path)
            member.size, member.mode = len(data), 0o644
            tar.addfile(member, io.BytesIO(data))
    return buf.getvalue()


def _rejected(violations: list[Violation]) -> dict[str, Any]:
    syntax_only = all(v.rule == "syntax" for v in violations)
    return {
        "reason": "a source file does not parse" if syntax_only else "the source policy rejected the patch",
        "policy_violations": [str(v) for v in violations[:50]],
        "tampered": not syntax_only,
        "tamper_reasons": [] if syntax_only else [f"source policy: {v}" for v in violations[:5]],
    }


async def fresh_sandboxes(sandbox: Sandbox) -> Callable[[], Awaitable[Sandbox]]:
    """A maker of fresh sandboxes like ``sandbox`` (a DockerSandbox): its image, limits and run label."""
    if not isinstance(sandbox, DockerSandbox):
        raise TypeError(f"grading needs a DockerSandbox, got {type(sandbox).__name__}")
    labels = (await sandbox.api.inspect(sandbox.id)).get("Config", {}).get("Labels") or {}
    run = labels.get("pqrl.run", "grader")

    async def make() -> Sandbox:
        return await DockerSandbox.create(
            sandbox.api, sandbox.settings, run=run, session=f"grade-{uuid.uuid4().hex}"
        )

    return make


class CodingGrader:
    """Grades coding submissions in fresh sandboxes, at most ``slots`` at a time.

    Args:
        make_sandbox: creates a fresh sandbox from the agent's image (closed after each grading).
        slots: shared concurrency limit (default: ``grading_slots()`` of the running loop).
        test_timeout: seconds for the hidden test run.
        source_policy: check patched sources before running them. Only tests turn this off, to
            show what the runtime checks catch on their own.
    """

    def __init__(
        self,
        make_sandbox: Callable[[], Awaitable[Sandbox]],
        *,
        slots: asyncio.Semaphore | None = None,
        test_timeout: float = 120.0,
        source_policy: bool = True,
    ) -> None:
        self.make_sandbox = make_sandbox
        self.slots = slots
        self.test_timeout = test_timeout
        self.source_policy = source_policy

    @classmethod
    async def for_sandbox(cls, sandbox: Sandbox, **kwargs: Any) -> CodingGrader:
        """A grader whose fresh sandboxes match ``sandbox`` (a DockerSandbox): image, limits, run label."""
        return cls(await fresh_sandboxes(sandbox), **kwargs)

    async def grade_workspace(
        self, task: CodingTask, sandbox: Sandbox, base_commit: str | None = None
    ) -> GradeResult:
        """Captures the agent's workspace and grades it."""
        t0 = time.monotonic()
        submission = await capture_workspace(sandbox, task, base_commit)
        result = await self.grade(task, submission)
        result.info["timings"]["capture_s"] = round(
            time.monotonic() - t0 - result.info["timings"]["total_s"], 3
        )
        return result

    async def grade_patch(self, task: CodingTask, patch: str) -> GradeResult:
        """Grades a patch against the task's repository (only its source-file parts count)."""
        return await self.grade(task, submission_from_patch(task, patch))

    async def grade(self, task: CodingTask, submission: Submission) -> GradeResult:
        t0 = time.monotonic()
        # The gold record first: computing it takes a slot of its own, so it must not wait inside one.
        reference = await self.reference(task) if task.gold_patch else None
        slots = self.slots or grading_slots()
        async with slots:
            timings = {"queue_s": round(time.monotonic() - t0, 3)}
            sandbox = await self.make_sandbox()
            timings["sandbox_s"] = round(time.monotonic() - t0 - timings["queue_s"], 3)
            try:
                result = await self._run(task, submission, sandbox, timings, reference)
            finally:
                await sandbox.close()
        tampered = bool(submission.tampered_paths) or result.info.get("tampered", False)
        reasons = [f"changed protected path {p}" for p in submission.tampered_paths]
        info = {
            **submission.info,
            **result.info,
            "dropped_paths": submission.dropped,
            "tampered": tampered,
            "tamper_reasons": reasons + result.info.get("tamper_reasons", []),
            "timings": {**timings, "total_s": round(time.monotonic() - t0, 3)},
        }
        return GradeResult(result.reward, sendable(info))  # strings from the sandbox: made sendable

    async def _run(
        self,
        task: CodingTask,
        sub: Submission,
        sandbox: Sandbox,
        timings: dict[str, float],
        reference: Reference | None,
    ) -> GradeResult:
        t = time.monotonic()
        gdir = f"/tmp/pqrl-grade-{secrets.token_hex(8)}"
        sources = source_files(task.repo, task.hidden_tests)
        apply_error = await _checkout(sandbox, task, sub.patch, gdir)
        if apply_error is not None:
            reason = f"the patch does not apply: {git_error(apply_error)}"
            return GradeResult(0.0, {"reason": reason, "apply_error": apply_error[-2000:]})
        violations: list[Violation] = []
        for path in sources:
            try:
                patched = await sandbox.read_file(f"{WORKSPACE}/{path}", max_bytes=MAX_SOURCE_BYTES)
            except (FileNotFoundError, IsADirectoryError):
                continue  # deleted: the tests decide what that is worth
            except ValueError:  # larger than the policy allows: never run unchecked
                violations.append(Violation(path, 0, "size", f"over {MAX_SOURCE_BYTES} bytes"))
                continue
            if self.source_policy and patched != task.repo[path].encode():
                violations += await ast_work(check_source, path, patched, task.repo[path].encode())
        timings["apply_s"] = round(time.monotonic() - t, 3)
        if violations:
            return GradeResult(0.0, _rejected(violations))
        return await self._test(task, sandbox, gdir, timings, reference)

    async def _test(
        self,
        task: CodingTask,
        sandbox: Sandbox,
        gdir: str,
        timings: dict[str, float],
        reference: Reference | None,
    ) -> GradeResult:
        t = time.monotonic()
        files = reference.files if reference else task.hidden_tests
        try:
            report, canary = await self._run_tests(task, sandbox, gdir, files)
        except SandboxDied as e:  # the submitted code took the container down (e.g. memory)
            return GradeResult(0.0, {"reason": f"the grading sandbox died during the tests: {e}"})
        except _RunnerFailed as e:
            return GradeResult(0.0, e.info)
        timings["tests_s"] = round(time.monotonic() - t, 3)
        result = await asyncio.to_thread(judge, task, report, canary, reference)  # parses the report
        result.info["runner_dumpable_off"] = report.get("dumpable_off")
        return result

    async def _run_tests(
        self,
        task: CodingTask,
        sandbox: Sandbox,
        gdir: str,
        tests: Mapping[str, str],
        timeout: float | None = None,
    ) -> tuple[dict[str, Any], str]:
        """Copies ``tests`` over the workspace's tests and runs them under the runner; returns its
        report and the canary name. Raises _RunnerFailed when the runner itself fails."""
        canary = f"pqrl_{secrets.token_hex(6)}"
        report_dir = f"/tmp/pqrl-report-{secrets.token_hex(16)}"
        await sandbox.upload(_tar(tests), WORKSPACE)  # over the (pristine) visible tests
        await sandbox.upload(
            _tar(
                {
                    "runner.py": RUNNER_SOURCE,
                    f"lib/{probes.MODULE}.py": PROBE_RUNTIME_SOURCE,
                    "pytest.ini": _INI.format(root=WORKSPACE, lib=f"{gdir}/lib"),
                    f"canary/test_{canary}.py": _CANARY.format(name=canary),
                }
            ),
            gdir,
        )
        paths = [f"{WORKSPACE}/{p}" for p in sorted(tests)] + [f"{gdir}/canary/test_{canary}.py"]
        argv = [
            *("python3", "-I", "-B", "-m", "pytest", "-c", f"{gdir}/pytest.ini", "--rootdir", WORKSPACE),
            *("-p", "no:cacheprovider", "--noconftest", "--junitxml={junit}", "-q", "--tb=short"),
            *paths,
        ]
        env = {"PATH": _PATH, "HOME": f"{gdir}/home", "LANG": "C.UTF-8"}
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        timeout = self.test_timeout if timeout is None else timeout
        config = {"argv": argv, "cwd": gdir, "env": env, "timeout": timeout}
        config["report_dir"] = report_dir
        runner = ["python3", "-I", "-B", f"{gdir}/runner.py"]
        stdin = json.dumps(config).encode()
        run = await sandbox.exec(runner, cwd=gdir, stdin=stdin, timeout=timeout + 30)
        if not run.ok:
            planted = run.exit_code == 3
            raise _RunnerFailed(
                {
                    "reason": f"the test runner failed (exit {run.exit_code})",
                    "tampered": planted,
                    "runner_output": run.text()[-2000:],
                    "tamper_reasons": ["the report directory existed before the run"] if planted else [],
                }
            )
        return json.loads(await sandbox.read_file(f"{report_dir}/report.json", max_bytes=32 << 20)), canary

    async def reference(self, task: CodingTask) -> Reference:
        """The gold solution's probe record for ``task``, computed once per process (two runs, each in a
        fresh sandbox, so values that vary between runs are known) and kept on the host."""
        key = _reference_key(task)
        if key in _REFERENCES:
            return _REFERENCES[key]
        locks = _REFERENCE_LOCKS.setdefault(asyncio.get_running_loop(), {})
        async with locks.setdefault(key, asyncio.Lock()):  # one computation per task, across graders
            if key not in _REFERENCES:
                while len(_REFERENCES) >= MAX_REFERENCES:  # oldest first: a bounded cache
                    _REFERENCES.pop(next(iter(_REFERENCES)))
                _REFERENCES[key] = await self._compute_reference(task)
        return _REFERENCES[key]

    async def _compute_reference(self, task: CodingTask) -> Reference:
        """The rewritten tests on the unfixed repository in one fresh sandbox, then on the gold
        solution, each run in a sandbox of its own (tasks/coding/reference.py says which runs and
        why)."""
        tests = sorted(set(task.fail_to_pass) | set(task.pass_to_pass))
        async with self.slots or grading_slots():

            async def run_base(files: Mapping[str, str]) -> Record | None:
                box, gdir = await self.make_sandbox(), f"/tmp/pqrl-grade-{secrets.token_hex(8)}"
                try:
                    return await self._base_record(task, box, gdir, files)
                finally:
                    await box.close()

            async def gold_in(box: Sandbox, files: Mapping[str, str]) -> Record:
                gdir = f"/tmp/pqrl-grade-{secrets.token_hex(8)}"
                apply_error = await _checkout(box, task, task.gold_patch or "", gdir)
                if apply_error is not None:
                    why = git_error(apply_error)
                    raise GoldReferenceError(f"task {task.id}: the gold patch does not apply: {why}")
                return await self._gold_record(task, box, gdir, files)

            run_gold = gold_runs_apart(self.make_sandbox, gold_in)
            return await build_reference(task.id, task.hidden_tests, tests, run_base, run_gold)

    async def _base_record(
        self, task: CodingTask, sandbox: Sandbox, gdir: str, files: Mapping[str, str]
    ) -> Record | None:
        """The probe record of the unfixed repository, or None when there is none to read (its
        code may hang, crash pytest or take the container down: the base is only evidence)."""
        await _checkout(sandbox, task, "", gdir)
        try:
            report, _ = await self._run_tests(task, sandbox, gdir, files, min(self.test_timeout, 30.0))
            return probes.parse_record(base64.b64decode(report.get("probes", "")))
        except (_RunnerFailed, SandboxDied, ValueError):  # BadRecord is a ValueError
            return None

    async def _gold_record(
        self, task: CodingTask, sandbox: Sandbox, gdir: str, files: Mapping[str, str]
    ) -> Record:
        report, canary = await self._run_tests(task, sandbox, gdir, files)
        verdict = judge(task, report, canary, None)
        if verdict.reward != 1.0:
            why = verdict.info["reason"]
            raise GoldReferenceError(f"task {task.id}: the gold patch fails: {why}")
        if report.get("probes_overflow"):  # a record with entries missing judges every submission wrongly
            raise GoldReferenceError(f"task {task.id}: the gold's probe record is larger than kept")
        return probes.parse_record(base64.b64decode(report.get("probes", "")))


async def _checkout(sandbox: Sandbox, task: CodingTask, patch: str, gdir: str) -> str | None:
    """The pristine repository in ``sandbox``'s workspace with ``patch`` applied by ``git apply``;
    git's complaint when it does not apply, else None."""
    await sandbox.upload(_tar(task.repo), WORKSPACE)
    if not patch:
        return None
    await sandbox.upload(_tar({"patch.diff": patch}), gdir)
    applied = await sandbox.exec(["git", "apply", "--whitespace=nowarn", f"{gdir}/patch.diff"], cwd=WORKSPACE)
    return None if applied.ok else applied.text()


class _RunnerFailed(Exception):
    def __init__(self, info: dict[str, Any]) -> None:
        super().__init__(info["reason"])
        self.info = info


_REFERENCES: dict[str, Reference] = {}
MAX_REFERENCES = 4096
_REFERENCE_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _reference_key(task: CodingTask) -> str:
    blob = json.dumps([probes.SCHEME, task.repo, task.hidden_tests, task.gold_patch], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()
