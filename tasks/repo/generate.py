"""``repo`` tasks from a real project's own tests, by AST-injected bugs (SWE-smith's recipe).

1. **Images** (sandboxes/recipes.py, offline): an environment image (the base, the test
   requirements, the project's metadata: no code) and, on it, the clean tree's image for the runs
   below. Each task gets its own image on the same environment image: one small layer with the
   buggy tree, tagged by content, so a rerun builds nothing.
2. **Baseline**: the project's test files run twice in sandboxes of the clean image (the grader's
   pytest command, JUnit); the baseline is the ids that pass both times (flaky ones drop out).
3. **Mutants**: every mutation (tasks/coding/mutations.py) inside a function of the package's
   source, in an order drawn from the seed, at most ``per_function`` kept per function. Each runs
   only the test files whose imports reach the mutated module (tasks/repo/project.py). It is kept
   when at least one baseline test of those files fails (reported, not missing) and one passes:
   FAIL_TO_PASS the failing ids, PASS_TO_PASS every other baseline id of those files. Outcomes are
   cached by content in pqrl's cache, so a rerun runs no test it ran before.
4. **Tasks**: the image's ``/repo`` holds the buggy tree without the failing tests' files (a fresh
   one-commit history: the clean code is nowhere in it); ``test_patch`` adds those files back
   as they ship; ``patch`` is the inverse edit; the issue is written from the first failing test.
5. **Check**: each task runs as ``pqrl tasks validate --check`` runs it (gold 1, empty 0, the
   grader's values verdict judging every FAIL_TO_PASS test safely); one that fails is dropped with
   its reason and later mutants are drawn in its place, so the suite written passes the check.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_server.sessions import SessionManager
from pqrl.cache import cache_dir
from pqrl.errors import UsageError
from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from sandboxes.protocol import SandboxError
from sandboxes.recipes import REPO_PATH, WORKSPACE, RepoRecipe, build_recipe
from sandboxes.repo_source import stage_repository
from tasks.check import check_suite
from tasks.coding.diffs import unified_diff
from tasks.coding.grader import _tar
from tasks.coding.issues import issue_text
from tasks.coding.junit import ReportError, TestOutcome, parse_junit
from tasks.coding.mutations import Mutation, candidates, parses
from tasks.repo.project import Project
from tasks.repo.task import RepoTask, task_id
from tasks.suite import Suite, SuiteManifest

__all__ = ["TEST_COMMAND", "Generated", "Options", "generate_tasks"]

TEST_COMMAND = "python3 -m pytest -p no:cacheprovider -o addopts="  # the project's addopts may need plugins
_REVISION = 1  # bump when what a cached outcome means changes
_JUNIT = "/tmp/pqrl-gen-junit.xml"
_FRESH = (
    f'find /tmp -mindepth 1 -user "$(id -u)" -delete; find {WORKSPACE} -mindepth 1 -delete'
    f" && cp -a {REPO_PATH}/. {WORKSPACE}/ && rm -f {_JUNIT}"
)


@dataclass(frozen=True)
class Options:
    seed: int = 0
    max_tasks: int = 50
    per_function: int = 1
    requirements: tuple[str, ...] = ()
    workers: int = 2
    name: str | None = None
    check: bool = True  # each task passes validate --check before it is kept


@dataclass
class Generated:
    suite: Suite
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Kept:
    path: str
    mutation: Mutation
    fail: list[str]
    passing: list[str]
    first: TestOutcome


def _images(project: Project, requirements: tuple[str, ...], say: Callable[[str], None]) -> tuple[str, str]:
    """The environment image (requirements, metadata, no code) and the clean tree's image on it."""
    with tempfile.TemporaryDirectory(prefix="pqrl-meta-") as tmp:
        for name in ("PKG-INFO", "pyproject.toml"):  # what the editable install's metadata is read from
            if (project.root / name).is_file():
                shutil.copy2(project.root / name, Path(tmp) / name)
        env = build_recipe(RepoRecipe(name=f"{project.name}-env", source=tmp, requirements=requirements,
                                      install="editable"), progress=say)  # fmt: skip
    clean = build_recipe(RepoRecipe(name=project.name, source=str(project.root), install="editable",
                                    base_image=env), progress=say)  # fmt: skip
    return env, clean


class _Runner:
    """Runs test files in sandboxes of the clean image, with some files replaced."""

    def __init__(self, image: str, workers: int, timeout: float) -> None:
        self.settings = SandboxSettings(image=image, memory_mb=2048, workspace_mb=1024)
        self.workers, self.timeout = workers, timeout
        self.boxes: asyncio.Queue[DockerSandbox] = asyncio.Queue()
        self.api = DockerAPI()

    async def __aenter__(self) -> _Runner:
        for _ in range(self.workers):
            self.boxes.put_nowait(await DockerSandbox.create(self.api, self.settings, run="pqrl-generate"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        while not self.boxes.empty():
            await self.boxes.get_nowait().close()
        await self.api.close()

    async def run(
        self, files: list[str], replace: dict[str, str], timeout: float
    ) -> tuple[dict[str, TestOutcome] | None, bool]:
        """Outcomes by id (None when the run timed out or left no readable report), and whether it
        timed out."""
        box = await self.boxes.get()
        try:
            box = await self._fresh(box)
            if replace:
                await box.upload(_tar(replace), WORKSPACE)
            argv = [*TEST_COMMAND.split(), f"--rootdir={WORKSPACE}", f"--junitxml={_JUNIT}", "-q", *files]
            r = await box.exec(argv, cwd=WORKSPACE, env={"PYTHONDONTWRITEBYTECODE": "1"}, timeout=timeout)
            if r.timed_out:
                return None, True
            return {
                o.id: o for o in parse_junit(await box.read_file(_JUNIT, max_bytes=2 << 20), files)
            }, False
        except (ReportError, OSError, ValueError, SandboxError):
            return None, False  # no report, or the mutant took its sandbox down (memory): dropped
        finally:
            self.boxes.put_nowait(box)

    async def _fresh(self, box: DockerSandbox) -> DockerSandbox:
        """``box`` with /workspace a fresh copy of /repo and the last run's files gone from /tmp;
        a new sandbox when the last run left ``box`` dead or with files it cannot remove."""
        for attempt in (1, 2):
            if box.alive:
                r = await box.exec(["sh", "-c", _FRESH], timeout=120)
                if r.ok:
                    return box
                if attempt == 2:
                    raise RuntimeError(f"copying {REPO_PATH} into a new sandbox failed: {r.text()[-300:]}")
            await box.close()
            box = await DockerSandbox.create(self.api, self.settings, run="pqrl-generate")
        return box


class _Cache:
    """Mutant outcomes by content (the clean image, the files run, the mutated text), one JSON line
    each. A run that timed out is known only up to its timeout: a longer one runs it again."""

    def __init__(self, key: str) -> None:
        self.path = cache_dir("generate") / f"{key}.jsonl"
        self.known: dict[str, tuple[dict[str, Any] | None, float | None]] = {}
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    record = json.loads(line)
                    limit = record.get("timed_out_at")
                    self.known[record["key"]] = (record["outcomes"], None if limit is None else float(limit))

    @staticmethod
    def key(*parts: str) -> str:
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def put(
        self, key: str, outcomes: dict[str, TestOutcome] | None, timed_out_at: float | None = None
    ) -> None:
        """``timed_out_at``: the timeout the run reached (None: it finished, or broke)."""
        data = None if outcomes is None else {i: [o.outcome, o.message, o.text] for i, o in outcomes.items()}
        self.known[key] = (data, timed_out_at)
        with open(self.path, "a") as f:
            f.write(json.dumps({"key": key, "outcomes": data, "timed_out_at": timed_out_at}) + "\n")

    def get(self, key: str, timeout: float = 0.0) -> tuple[bool, dict[str, TestOutcome] | None]:
        """(hit, outcomes); a miss for a run that timed out before ``timeout``."""
        if key not in self.known:
            return False, None
        data, limit = self.known[key]
        if limit is not None and limit < timeout:
            return False, None
        if data is None:
            return True, None
        return True, {i: TestOutcome(i, v[0], v[1], v[2]) for i, v in data.items()}


async def _baseline(runner: _Runner, tests: list[str], say: Callable[[str], None]) -> tuple[set[str], float]:
    runs = []
    t0 = time.monotonic()
    for attempt in (1, 2):
        outcomes, _ = await runner.run(tests, {}, 1800)
        if outcomes is None:
            raise UsageError("the project's tests time out or write no JUnit report in the sandbox")
        runs.append({i for i, o in outcomes.items() if o.outcome == "passed"})
        say(f"baseline run {attempt}: {len(runs[-1])} of {len(outcomes)} tests pass")
        if not runs[-1]:  # nothing to keep a bug by: say why the clean tree fails
            first = next(iter(outcomes.values()), None)
            why = _failure_line(first) if first else "none ran"
            raise UsageError(
                f"no test passes on the clean tree in the sandbox ({why})",
                fix="add what the tests or the package import with --requirements SPEC (repeatable)",
            )
    return runs[0] & runs[1], (time.monotonic() - t0) / 2


def _failure_line(o: TestOutcome) -> str:
    """A test's failure in one line: its id, message, and the traceback's last error line (a
    collection error's ``ModuleNotFoundError: No module named 'x'`` is where the cause is)."""
    lines = [ln.strip() for ln in o.text.splitlines() if ln.strip()]
    error = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "")
    extra = f"; {error}" if error and error not in o.message else ""
    return f"{o.id}: {o.message or o.outcome}{extra}"[:400]


def _candidates(project: Project, seed: int) -> list[tuple[str, Mutation]]:
    found = [
        (path, m) for path, text in sorted(project.sources.items()) for m in candidates(text) if m.function
    ]
    random.Random(f"pqrl-repo:{seed}:{project.origin}").shuffle(found)
    return found


def _judge(path: str, m: Mutation, baseline: list[str], got: dict[str, TestOutcome] | None) -> _Kept | None:
    if got is None or any(t not in got for t in baseline):
        return None  # timed out, or a test vanished (the mutant broke collection)
    fail = [t for t in baseline if got[t].outcome in ("failed", "error")]
    passing = [t for t in baseline if got[t].outcome == "passed"]
    if not fail or not passing or len(fail) + len(passing) != len(baseline):
        return None
    return _Kept(path, m, fail, passing, got[fail[0]])


class _Draws:
    """Mutants drawn in the seed's order, run and judged; ``more`` resumes where the last call
    stopped, so tasks dropped by the check are replaced by later mutants, never by earlier ones."""

    def __init__(self, project: Project, runner: _Runner, cache: _Cache, clean: str, opts: Options) -> None:
        self.project, self.runner, self.cache, self.clean, self.opts = project, runner, cache, clean, opts
        self.per_function: dict[str, int] = {}
        self.seen = set(project.sources.values())
        self.files_run: list[int] = []
        self.stats: dict[str, Any] = {}
        self.baseline: set[str] = set()
        self.scope: dict[str, list[str]] = {}
        self.queue: list[tuple[int, str, Mutation]] = []  # (draw index, path, mutation): a heap
        self.deferred: dict[str, list[tuple[int, str, Mutation]]] = {}
        self.t0 = time.monotonic()

    async def start(self, say: Callable[[str], None]) -> None:
        baseline, base_s = await _baseline(self.runner, self.project.tests, say)
        self.baseline = baseline
        self.runner.timeout = max(30.0, 10 * base_s)  # a mutant that loops forever is dropped, not waited for
        reached = self.project.tests_reaching
        self.scope = {p: [t for t in reached(p) if any(b.startswith(t + "::") for b in baseline)]
                      for p in self.project.sources}  # fmt: skip
        drawn = [(p, m) for p, m in _candidates(self.project, self.opts.seed) if self.scope[p]]
        self.queue = [(i, p, m) for i, (p, m) in enumerate(drawn)]  # in draw order: a heap already
        self.stats = {"baseline_tests": len(baseline), "test_files": len(self.project.tests),
                      "candidates": len(drawn), "tried": 0, "cached": 0,
                      "baseline_s": round(base_s, 2)}  # fmt: skip
        self.t0 = time.monotonic()

    async def _outcomes(self, path: str, mutated: str) -> tuple[bool, dict[str, TestOutcome] | None]:
        key = _Cache.key(str(_REVISION), self.clean, *self.scope[path], path, mutated)
        hit, got = self.cache.get(key, self.runner.timeout)
        if not hit:
            got, timed_out = await self.runner.run(self.scope[path], {path: mutated}, self.runner.timeout)
            self.cache.put(key, got, self.runner.timeout if timed_out else None)
        return hit, got

    def _batch(self) -> list[tuple[int, str, Mutation, str]]:
        """The next ``workers`` runnable mutants in draw order. One of a function already at
        ``per_function`` (kept or running) waits in ``deferred``: it is drawn again, in its place,
        if that function's mutant is not kept or its task is dropped by the check."""
        batch: list[tuple[int, str, Mutation, str]] = []
        pending = dict(self.per_function)
        while self.queue and len(batch) < self.opts.workers:
            i, path, m = heapq.heappop(self.queue)
            fn = f"{path}:{m.function}"
            if pending.get(fn, 0) >= self.opts.per_function:
                self.deferred.setdefault(fn, []).append((i, path, m))
                continue
            mutated = m.apply(self.project.sources[path])
            if mutated in self.seen or not parses(mutated):
                continue  # parsed only when drawn: a big module has thousands
            self.seen.add(mutated)
            pending[fn] = pending.get(fn, 0) + 1
            batch.append((i, path, m, mutated))
        return batch

    def _requeue(self) -> None:
        for fn in [f for f in self.deferred if self.per_function.get(f, 0) < self.opts.per_function]:
            for item in self.deferred.pop(fn):
                heapq.heappush(self.queue, item)

    def release(self, k: _Kept) -> None:
        """``k``'s task was dropped: its function may have another mutant."""
        fn = f"{k.path}:{k.mutation.function}"
        self.per_function[fn] -= 1
        self._requeue()

    async def more(self, want: int, say: Callable[[str], None]) -> list[_Kept]:
        """Up to ``want`` more kept mutants (fewer when the candidates run out)."""
        kept: list[_Kept] = []
        # Batches of `workers` mutants run at once and are judged in draw order, so which are kept
        # depends only on the seed and the outcomes (a rerun from the cache gives the same suite).
        while len(kept) < want:
            batch = self._batch()
            if not batch:
                break
            results = await asyncio.gather(*(self._outcomes(p, mutated) for _, p, _, mutated in batch))
            for (i, path, m, mutated), (hit, got) in zip(batch, results, strict=True):
                fn = f"{path}:{m.function}"
                ids = sorted(b for b in self.baseline if b.split("::", 1)[0] in self.scope[path])
                found = _judge(path, m, ids, got)
                if found is not None and len(kept) == want:  # beyond this call: drawn again in its place
                    self.seen.discard(mutated)
                    heapq.heappush(self.queue, (i, path, m))
                    continue
                self.stats["tried"] += 1
                self.stats["cached"] += hit
                self.files_run.append(len(self.scope[path]))
                if found is not None and self.per_function.get(fn, 0) < self.opts.per_function:
                    kept.append(found)
                    self.per_function[fn] = self.per_function.get(fn, 0) + 1
            self._requeue()
            rate = (time.monotonic() - self.t0) / self.stats["tried"]
            say(f"mutants tried {self.stats['tried']}, kept {len(kept)} of the {want} wanted now; "
                f"{rate:.1f}s each")  # fmt: skip
        self.stats["mutant_s"] = round((time.monotonic() - self.t0) / max(1, self.stats["tried"]), 2)
        self.stats["files_per_mutant"] = round(sum(self.files_run) / max(1, len(self.files_run)), 2)
        return kept


def _task(project: Project, n: int, k: _Kept, env: str, say: Callable[[str], None]) -> RepoTask:
    clean = project.sources[k.path]
    buggy = k.mutation.apply(clean)
    hidden = sorted({t.split("::", 1)[0] for t in k.fail})
    test_files = {f: (project.root / f).read_text() for f in hidden}
    first_file = k.first.id.split("::", 1)[0]
    with tempfile.TemporaryDirectory(prefix="pqrl-bug-", dir=cache_dir("generate")) as tmp:
        tree = Path(tmp, "tree")
        shutil.copytree(project.root, tree, symlinks=True)
        (tree / k.path).write_text(buggy)
        for f in hidden:
            (tree / f).unlink()
        image = build_recipe(RepoRecipe(name=f"{project.name}-bug", source=str(tree), install="editable",
                                        base_image=env), progress=say)  # fmt: skip
        stage_repository(tree, None, Path(tmp, "staged"), f"{project.name}-bug")  # as the recipe does
        commit = (Path(tmp, "staged", ".git", "refs", "heads", "main")).read_text().strip()
    m = k.mutation
    return RepoTask(
        id=task_id(f"{project.name}-{n:03d}"),
        instance_id=f"{project.origin}:{k.path}:{m.function}:{m.line}:{m.kind}",
        repo=project.name,
        base_commit=commit,
        problem_statement=issue_text(project.name, k.path, first_file, test_files[first_file], k.first),
        patch=unified_diff(k.path, buggy, clean),
        test_patch="".join(unified_diff(f, None, text) for f, text in test_files.items()),
        fail_to_pass=k.fail,
        pass_to_pass=k.passing,
        test_command=TEST_COMMAND,
        image=image,
        repo_path=REPO_PATH,
    )


def generate_tasks(project: Project, opts: Options, say: Callable[[str], None] = print) -> Generated:
    """The suite of up to ``opts.max_tasks`` bugs of ``project``. With ``opts.check`` each task is run
    as ``pqrl tasks validate --check`` runs it (gold 1, empty 0) before it is kept; one that fails
    is dropped with its reason and the next mutants are drawn in its place."""
    stats: dict[str, Any] = {"project": project.origin, "requirements": list(opts.requirements)}
    t0 = time.monotonic()
    env, clean = _images(project, opts.requirements, say)
    stats["images_s"] = round(time.monotonic() - t0, 2)
    cache = _Cache(_Cache.key(str(_REVISION), clean))
    checks = _Checks(_Cache.key(str(_REVISION), clean))
    name = opts.name or task_id(project.name)
    manifest = SuiteManifest(name=name, version="1", env_id="repo-v1", kind="repo", reward="env")
    tasks: list[RepoTask] = []
    dropped: list[str] = []
    timing = {"task_images_s": 0.0, "check_s": 0.0}

    async def run() -> dict[str, Any]:
        manager = SessionManager(pool_size=0) if opts.check else None
        try:
            async with _Runner(clean, opts.workers, timeout=120) as runner:
                draws = _Draws(project, runner, cache, clean, opts)
                await draws.start(say)
                while len(tasks) < opts.max_tasks:
                    kept = await draws.more(opts.max_tasks - len(tasks), say)
                    if not kept:
                        break
                    t1 = time.monotonic()
                    made = [
                        _task(project, len(tasks) + len(dropped) + i, k, env, say) for i, k in enumerate(kept)
                    ]
                    t2 = time.monotonic()
                    passed = await _checked(made, manifest, manager, checks, opts.workers, dropped, say)
                    tasks.extend(passed)
                    ok = {t.id for t in passed}
                    for k, task in zip(kept, made, strict=True):
                        if task.id not in ok:
                            draws.release(k)
                    timing["task_images_s"] += t2 - t1
                    timing["check_s"] += time.monotonic() - t2
                return draws.stats
        finally:
            if manager is not None:
                await manager.shutdown()

    stats |= asyncio.run(run())
    if 0 < len(tasks) < opts.max_tasks:
        say(f"the mutants ran out: {len(tasks)} of the {opts.max_tasks} tasks wanted "
            f"({stats['tried']} tried, {len(dropped)} dropped by the check)")  # fmt: skip
    if not tasks:
        why = f"; {len(dropped)} failed the check, the first: {dropped[0]}" if dropped else ""
        raise UsageError(f"{project.origin}: none of {stats['tried']} mutants makes a usable task{why}")
    # numbered in suite order once the check has spoken, so a suite has no holes in its ids
    tasks = [t.model_copy(update={"id": task_id(f"{project.name}-{n:03d}")}) for n, t in enumerate(tasks)]
    stats |= {"kept": len(tasks), "dropped": dropped, "check_s": round(timing["check_s"], 1),
              "task_images_s": round(timing["task_images_s"] / (len(tasks) + len(dropped)), 2)}  # fmt: skip
    manifest = manifest.model_copy(update={"description": (
        f"{len(tasks)} bugs injected by AST mutation into {project.origin} (seed {opts.seed}), "
        "graded by its own tests")})  # fmt: skip
    return Generated(Suite(manifest, tuple(tasks)), stats)


class _Checks:
    """Check verdicts by the task's content and the grader's code (a changed grader checks again),
    one JSON line each: a rerun checks no task it checked before."""

    def __init__(self, key: str) -> None:
        self.path = cache_dir("generate") / f"{key}-checks.jsonl"
        root = Path(__file__).parents[2]  # the grader, what runs it and where: tasks, env_server, sandboxes
        grader = sorted(f for d in ("tasks", "env_server", "sandboxes") for f in (root / d).glob("**/*.py"))
        self.grader = _Cache.key(*(f.read_text() for f in grader))
        self.known: dict[str, str] = {}
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    record = json.loads(line)
                    self.known[str(record["key"])] = str(record["reason"])

    def key(self, task: RepoTask) -> str:
        return _Cache.key(str(_REVISION), self.grader, task.model_dump_json(exclude={"id"}))

    def put(self, key: str, reason: str) -> None:
        self.known[key] = reason
        with open(self.path, "a") as f:
            f.write(json.dumps({"key": key, "reason": reason}) + "\n")


async def _checked(
    made: list[RepoTask],
    manifest: SuiteManifest,
    manager: SessionManager | None,
    checks: _Checks,
    jobs: int,
    dropped: list[str],
    say: Callable[[str], None],
) -> list[RepoTask]:
    """``made`` less the tasks that fail the check (each named in ``dropped`` with its reason)."""
    if manager is None:
        return made
    todo = [t for t in made if checks.key(t) not in checks.known]
    lost: dict[str, str] = {}  # the machine's fault: not judged, so not remembered either
    if todo:
        failures = await check_suite(Suite(manifest, tuple(todo)), jobs=jobs, progress=say, manager=manager)
        failed = {f.task_id: f.reason for f in failures if not f.transient}
        lost = {f.task_id: f"could not be checked: {f.reason}" for f in failures if f.transient}
        for task in todo:
            if task.id not in lost:
                checks.put(checks.key(task), failed.get(task.id, ""))
    kept = []
    for task in made:
        reason = lost.get(task.id) or checks.known[checks.key(task)]
        if reason:
            dropped.append(f"{task.instance_id}: {reason}")
            say(f"dropped {task.instance_id}: {reason[:300]}")
        else:
            kept.append(task)
    return kept
