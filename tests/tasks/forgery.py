"""Generic forgers of the coding grader's verdict, as an agent could write them with its own
write_file (their sources are in tests/tasks/forgers/: a kit, then one forger each), and the
battery that grades every forger on every built-in coding task. Used by
tests/tasks/test_coding_forgers.py and bench/forgers.py."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Callable
from pathlib import Path

from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from tasks.coding.diffs import source_files, unified_diff
from tasks.coding.env import builtin_suite
from tasks.coding.grader import CodingGrader, GradeResult
from tasks.suite import CodingTask

FORGER_DIR = Path(__file__).parent / "forgers"
KIT = (FORGER_DIR / "kit.py").read_text()
APPENDED: dict[str, str] = {p.stem: p.read_text() for p in sorted(FORGER_DIR.glob("f[0-9]*.py"))}


def edit_eq(source: str) -> str:
    """F3 as a source edit the policy allows: every ``__eq__`` the module already defines returns True
    (and every ``__ne__`` False), whatever the class."""
    lines = source.splitlines(keepends=True)
    methods = [
        f
        for c in ast.walk(ast.parse(source))
        if isinstance(c, ast.ClassDef)
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name in ("__eq__", "__ne__")
    ]
    for f in sorted(methods, key=lambda f: -f.lineno):
        first, last = f.body[0], f.body[-1]
        indent = " " * first.col_offset
        lines[first.lineno - 1 : last.end_lineno] = [f"{indent}return {f.name == '__eq__'}\n"]
    return "".join(lines)


EDITS: dict[str, Callable[[str], str]] = {"f3_eq_edit": edit_eq}
FORGERS = [*APPENDED, *EDITS]
TASKS: list[CodingTask] = list(builtin_suite().tasks)  # type: ignore[arg-type]


def forged_source(task: CodingTask, forger: str) -> tuple[str, str, str]:
    """(path, original, patched): the task's first source module with the kit and ``forger``
    appended, the bug left in place."""
    path = source_files(task.repo, task.hidden_tests)[0]
    source = task.repo[path]
    if forger in EDITS:
        return path, source, EDITS[forger](source)
    return path, source, f"{source}\n\n{KIT}\n\n{APPENDED[forger]}"


def applies(task: CodingTask, forger: str) -> bool:
    """Whether ``forger`` changes anything in ``task`` (an edit may find nothing to edit: then the
    submission is the unchanged buggy code, which scores 0 like any empty patch)."""
    _, source, patched = forged_source(task, forger)
    return patched != source


def forged_patch(task: CodingTask, forger: str) -> str:
    return unified_diff(*forged_source(task, forger))


def graders(api: DockerAPI, run: str) -> dict[bool, CodingGrader]:
    """Coding graders with the source policy on (True) and off (False), sharing the loop's slots."""

    async def make() -> DockerSandbox:
        return await DockerSandbox.create(api, SandboxSettings(memory_mb=512), run=run)

    return {policy: CodingGrader(make, source_policy=policy, test_timeout=30) for policy in (True, False)}


async def battery(
    by_policy: dict[bool, CodingGrader], forgers: list[str], tasks: list[CodingTask] = TASKS
) -> dict[tuple[str, bool, str], GradeResult | BaseException]:
    """(forger, policy, task id) -> the grading, or what grading raised; all concurrently, at the
    loop's grading concurrency."""
    jobs = [(f, p, t) for f in forgers for p in by_policy for t in tasks if applies(t, f)]
    return await grade_all(by_policy, jobs)


async def grade_all(
    by_policy: dict[bool, CodingGrader], jobs: list[tuple[str, bool, CodingTask]]
) -> dict[tuple[str, bool, str], GradeResult | BaseException]:
    results = await asyncio.gather(
        *(by_policy[p].grade_patch(t, forged_patch(t, f)) for f, p, t in jobs), return_exceptions=True
    )
    return {(f, p, t.id): r for (f, p, t), r in zip(jobs, results, strict=True)}
