"""The generic forgers (tests/tasks/forgery.py, and F7, which rewrites pytest's reports) on repo-v1
tasks built from a real project: bugs put into a clean checkout make one base (one image), and each
bug becomes a task whose gold patch takes it out again and whose test patch adds back the test class
that checks it (FAIL_TO_PASS: that class's tests the bug breaks and the gold fixes, found by running
them here; PASS_TO_PASS: other classes' tests the base passes). A forger is appended to the module
the gold patch touches, the bug left in place. Used by tests/tasks/test_repo_forgers.py and
bench/forgers.py --repo."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from sandboxes.recipes import RepoRecipe, build_recipe
from tasks.coding.diffs import split_patch, unified_diff
from tasks.coding.verdict import GradeResult
from tasks.repo.grading import grade_patch
from tasks.repo.task import RepoTask
from tests.tasks.forgery import APPENDED, EDITS, FORGER_DIR, FORGERS, KIT
from tests.tasks.test_repo_env import _git  # fixed identity and dates: the same files, the same commit

SOURCES = {**APPENDED, **{p.stem: p.read_text() for p in sorted((FORGER_DIR / "report").glob("f*.py"))}}
REPO_FORGERS = [*FORGERS, *(f for f in SOURCES if f not in APPENDED)]


@dataclass(frozen=True)
class Bug:
    """``find`` -> ``replace`` in ``path`` (once); ``test_class`` of ``tests`` checks it."""

    name: str
    path: str
    find: str
    replace: str
    tests: str
    test_class: str


@dataclass(frozen=True)
class Built:
    tasks: list[RepoTask]
    sources: dict[str, str]  # path -> the base's text of every module a bug is in


def _without(source: str, classes: Iterable[str]) -> str:
    """``source`` less the top-level classes named ``classes``."""
    lines = source.splitlines(keepends=True)
    drop = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name in set(classes)]
    for node in sorted(drop, key=lambda n: -n.lineno):
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        del lines[first - 1 : node.end_lineno]
    return "".join(lines)


def _outcomes(tree: Path, tests: str) -> dict[str, str]:
    """node id -> PASSED/FAILED/ERROR/SKIPPED of ``tests`` run with this Python's pytest in ``tree``."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "--color=no", tests]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run(argv, cwd=tree, capture_output=True, text=True, timeout=300, env=env).stdout
    found = re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED)\s+(\S+::\S+)", out, re.MULTILINE)
    return {node: outcome for outcome, node in found}


def build(project: Path, bugs: list[Bug], name: str, work: Path, p2p_count: int = 4) -> Built:
    """One image holding ``project`` with every bug in and their test classes out; a task per bug."""
    base = work / "base"
    shutil.copytree(project, base, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info"))
    originals = {b.tests: (project / b.tests).read_text() for b in bugs}
    for bug in bugs:
        text = (base / bug.path).read_text()
        assert text.count(bug.find) == 1, f"{bug.name}: {bug.find!r} is not in {bug.path} exactly once"
        (base / bug.path).write_text(text.replace(bug.find, bug.replace))
    for tests, text in originals.items():
        (base / tests).write_text(_without(text, [b.test_class for b in bugs if b.tests == tests]))
    sources = {b.path: (base / b.path).read_text() for b in bugs}
    base_runs = {t: _outcomes(base, t) for t in originals}
    _git(base, "init", "-q", "-b", "main")
    _git(base, "add", "-A")
    _git(base, "commit", "-qm", "base")
    commit = _git(base, "rev-parse", "HEAD")
    image = build_recipe(RepoRecipe(name=name, source=str(base), base_commit=commit, install="editable"))
    tasks = []
    for bug in bugs:
        others = [b.test_class for b in bugs if b.tests == bug.tests and b is not bug]
        tests = _without(originals[bug.tests], others)
        gold = unified_diff(bug.path, sources[bug.path], sources[bug.path].replace(bug.replace, bug.find))
        runs = {}
        for state, fixed in (("base", False), ("gold", True)):
            tree = work / f"{bug.name}-{state}"
            shutil.copytree(base, tree, ignore=shutil.ignore_patterns(".git"))
            (tree / bug.tests).write_text(tests)
            if fixed:
                (tree / bug.path).write_text(sources[bug.path].replace(bug.replace, bug.find))
            runs[state] = _outcomes(tree, bug.tests)
        ours = [t for t in runs["gold"] if f"::{bug.test_class}::" in t]
        f2p = sorted(t for t in ours if runs["gold"][t] == "PASSED" and runs["base"].get(t) != "PASSED")
        p2p = [
            t for t, o in base_runs[bug.tests].items() if o == "PASSED" and runs["gold"].get(t) == "PASSED"
        ]
        assert f2p, f"{bug.name}: no test of {bug.test_class} fails on the base and passes with the gold"
        tasks.append(
            RepoTask(
                id=f"{name}-{bug.name}",
                instance_id=f"{name}__{bug.name}",
                repo=name,
                base_commit=commit,
                problem_statement=f"{bug.test_class} fails",
                patch=gold,
                test_patch=unified_diff(bug.tests, (base / bug.tests).read_text(), tests),
                fail_to_pass=f2p,
                pass_to_pass=p2p[:p2p_count],
                image=image,
            )  # fmt: skip
        )
    return Built(tasks, sources)


def forged_patch(task: RepoTask, sources: dict[str, str], forger: str) -> str:
    """The kit and ``forger`` appended to the module the gold patch touches (or its edit), the bug
    left in place; "" when the edit finds nothing to edit."""
    path = next(
        p.new_path for p in split_patch(task.patch or "") if p.new_path and p.new_path.endswith(".py")
    )
    original = sources[path]
    patched = EDITS[forger](original) if forger in EDITS else f"{original}\n\n{KIT}\n\n{SOURCES[forger]}"
    return unified_diff(path, original, patched)


async def battery(
    api: DockerAPI, built: Built, run: str, verdict: str = "values", forgers: list[str] = REPO_FORGERS
) -> dict[tuple[str, str], GradeResult | BaseException]:
    """(submission, task id) -> its grading: "gold", "empty" and every forger that changes
    something, on every task, concurrently at the loop's grading concurrency."""

    def maker(task: RepoTask):  # noqa: ANN202
        async def make() -> DockerSandbox:
            return await DockerSandbox.create(api, SandboxSettings(image=task.image, memory_mb=1024), run=run)

        return make

    jobs: list[tuple[str, RepoTask, str]] = []
    for task in built.tasks:
        jobs += [("gold", task, task.patch or ""), ("empty", task, "")]
        jobs += [(f, task, p) for f in forgers if (p := forged_patch(task, built.sources, f))]
    results = await asyncio.gather(
        *(grade_patch(t, p.encode(), maker(t), timeout=60, verdict=verdict) for _, t, p in jobs),
        return_exceptions=True,
    )
    return {(who, t.id): r for (who, t, _), r in zip(jobs, results, strict=True)}
