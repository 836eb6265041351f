"""The coding suite generator: original modules plus AST-injected bugs, in the style of SWE-smith.

    python -m tasks.coding.generate           # rewrites tasks/coding/suite.jsonl
    python -m tasks.coding.generate --check   # regenerates and fails if the shipped file differs

For each module under ``repos/`` (``<name>/<name>.py`` with ``<name>/tests/test_<name>.py``),
the candidate mutations are put in an order drawn from the seed; each mutant's tests run locally
(one pytest subprocess per mutant), and the first ``per_module`` mutants that make at least one
test fail while at least one still passes are kept, at most two per function. Each becomes a task:

- ``repo``: the buggy module, a visible test file (the tests that pass, PASS_TO_PASS) and a README;
- ``hidden_tests``: the module's whole test file (same path, copied over the visible one);
- ``fail_to_pass`` / ``pass_to_pass``: pytest node ids;
- ``issue``: written from the first failing test (its code up to the failing line, and the error);
- ``gold_patch``: the inverse mutation, a git-style unified diff against the buggy repository.

Generation is offline and deterministic: the same seed and modules give the same suite (the test
outcomes of a mutant do not depend on time or order). It needs pytest on the host.
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tasks.coding.diffs import unified_diff
from tasks.coding.issues import issue_text
from tasks.coding.junit import ReportError, TestOutcome, parse_junit
from tasks.coding.mutations import Mutation, mutations
from tasks.suite import CodingTask, Suite, SuiteManifest, load_suite

__all__ = ["REPOS", "SUITE_PATH", "SourceRepo", "coding_suite", "module_tasks", "run_tests", "source_repos"]

REPOS = Path(__file__).parent / "repos"
SUITE_PATH = Path(__file__).parent / "suite.jsonl"
_INI = "[pytest]\naddopts =\njunit_family = xunit2\n"
_PER_FUNCTION = 2


@dataclass(frozen=True)
class SourceRepo:
    """One original module and its tests."""

    name: str
    source_path: str  # "roman.py"
    source: str
    test_path: str  # "tests/test_roman.py"
    tests: str

    @property
    def readme(self) -> str:
        summary = (ast.get_docstring(ast.parse(self.source)) or self.name).splitlines()[0]
        return f"# {self.name}\n\n{summary}\n\nRun the tests with `python3 -m pytest -q`.\n"


def source_repos(names: list[str] | None = None) -> list[SourceRepo]:
    """The shipped original modules (all, or those named), sorted by name."""
    found = []
    for d in sorted(p for p in REPOS.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        if names is None or d.name in names:
            source, tests = d / f"{d.name}.py", d / "tests" / f"test_{d.name}.py"
            found.append(
                SourceRepo(d.name, source.name, source.read_text(), "tests/" + tests.name, tests.read_text())
            )
    return found


def run_tests(
    files: dict[str, str], test_paths: list[str], timeout: float = 30.0
) -> dict[str, TestOutcome] | None:
    """Runs pytest on ``files`` in a temporary directory; outcomes by node id, None on a timeout."""
    with tempfile.TemporaryDirectory(prefix="pqrl-gen-") as tmp:
        root = Path(tmp)
        for rel, text in {**files, "pytest.ini": _INI}.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        # pytest prints full assertion diffs when CI or BUILD_NUMBER is set: drop them so the issue
        # texts (and the shipped suite) are the same wherever the generator runs.
        env = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER", "PYTEST_ADDOPTS")}
        env |= {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            "pytest.ini",
            "--junitxml=report.xml",
            *test_paths,
        ]
        try:
            subprocess.run(cmd, cwd=root, env=env, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return None
        try:
            outcomes = parse_junit((root / "report.xml").read_bytes(), test_paths)
        except (OSError, ReportError):
            return None
        return {o.id: o for o in outcomes}


def visible_tests(test_source: str, hidden: set[str]) -> str:
    """``test_source`` without the test functions named in ``hidden`` (whole lines, decorators too)."""
    tree = ast.parse(test_source)
    drop: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in hidden:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            drop.update(range(first, (node.end_lineno or node.lineno) + 1))
    lines = test_source.splitlines(keepends=True)
    kept = [line for n, line in enumerate(lines, 1) if n not in drop]
    text = "".join(kept)
    while "\n\n\n\n" in text:
        text = text.replace("\n\n\n\n", "\n\n\n")
    return text.rstrip("\n") + "\n"


def _task(
    repo: SourceRepo,
    mutation: Mutation,
    baseline: dict[str, TestOutcome],
    results: dict[str, TestOutcome],
    task_id: str,
) -> CodingTask | None:
    if set(results) != set(baseline):
        return None  # a test vanished: the mutant broke collection
    failing = [t for t in baseline if results[t].outcome != "passed"]
    passing = [t for t in baseline if results[t].outcome == "passed"]
    if not failing or not passing:
        return None
    buggy = mutation.apply(repo.source)
    hidden_names = {t.rsplit("::", 1)[-1] for t in failing}
    return CodingTask(
        id=task_id,
        repo={
            repo.source_path: buggy,
            repo.test_path: visible_tests(repo.tests, hidden_names),
            "README.md": repo.readme,
        },
        issue=issue_text(repo.name, repo.source_path, repo.test_path, repo.tests, results[failing[0]]),
        hidden_tests={repo.test_path: repo.tests},
        fail_to_pass=failing,
        pass_to_pass=passing,
        gold_patch=unified_diff(repo.source_path, buggy, repo.source),
    )


def module_tasks(
    repo: SourceRepo, *, seed: int = 0, per_module: int = 6, workers: int | None = None
) -> list[CodingTask]:
    """Up to ``per_module`` tasks from ``repo``'s mutants, chosen deterministically by ``seed``."""
    files = {repo.source_path: repo.source, repo.test_path: repo.tests}
    baseline = run_tests(files, [repo.test_path])
    if baseline is None or any(o.outcome != "passed" for o in baseline.values()):
        raise RuntimeError(f"{repo.name}: the original module does not pass its own tests")
    candidates = list(mutations(repo.source))
    random.Random(f"pqrl-coding:{seed}:{repo.name}").shuffle(candidates)
    workers = workers or max(1, min(8, os.cpu_count() or 1))
    tasks: list[CodingTask] = []
    per_function: dict[str, int] = {}
    with ThreadPoolExecutor(workers) as pool:
        for at in range(0, len(candidates), workers * 2):
            batch = [
                m
                for m in candidates[at : at + workers * 2]
                if per_function.get(m.function, 0) < _PER_FUNCTION
            ]
            outcomes = pool.map(
                lambda m: run_tests({**files, repo.source_path: m.apply(repo.source)}, [repo.test_path]),
                batch,
            )
            for mutation, results in zip(batch, list(outcomes), strict=True):
                if results is None or per_function.get(mutation.function, 0) >= _PER_FUNCTION:
                    continue
                task = _task(repo, mutation, baseline, results, f"{repo.name}-{len(tasks):02d}")
                if task is not None:
                    tasks.append(task)
                    per_function[mutation.function] = per_function.get(mutation.function, 0) + 1
                if len(tasks) == per_module:
                    return tasks
    return tasks


def coding_suite(
    *, seed: int = 0, per_module: int = 6, modules: list[str] | None = None, workers: int | None = None
) -> Suite:
    """The suite over the shipped modules (all, or those named)."""
    tasks = [
        task
        for repo in source_repos(modules)
        for task in module_tasks(repo, seed=seed, per_module=per_module, workers=workers)
    ]
    manifest = SuiteManifest(
        name="coding",
        version="1",
        env_id="coding-v1",
        kind="coding",
        reward="unit_tests",
        description=(
            f"{len(tasks)} bugs injected by AST mutation into small original Python modules (seed {seed}); "
            "gold_patch is a git-style unified diff against the buggy repository"
        ),
    )
    return Suite(manifest, tuple(tasks))


def load_coding_suite() -> Suite:
    """The shipped suite (tasks/coding/suite.jsonl)."""
    return load_suite(SUITE_PATH)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-module", type=int, default=6)
    parser.add_argument("--out", type=Path, default=SUITE_PATH)
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = parser.parse_args(argv)
    suite = coding_suite(seed=args.seed, per_module=args.per_module)
    text = suite.to_jsonl()
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(
            f"{suite.id}: {len(suite.tasks)} tasks; {'identical to' if same else 'DIFFERS from'} {args.out}"
        )
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {suite.id} ({len(suite.tasks)} tasks) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
