"""The generic forgers on repo-v1 tasks from a real project (more-itertools 10.5.0's sdist, bugs put
in, each task's test class held back in its test patch: tests/tasks/repo_forgery.py), graded by the
verdict given: which forgers score without fixing the bug. Gold must score 1 and empty 0.

    python bench/forgers.py --repo --verdict junit | tee bench/results/forgers_repo_before.log
    python bench/forgers.py --repo | tee bench/results/forgers_repo_after.log

``--suite FILE`` (repeatable) runs them on a suite of repo tasks instead, e.g. the ones
``pqrl tasks generate coding --from-sdist`` makes: each forger appended to the buggy module as the
task's image holds it (bench/results/forgers_generated.log).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning import short_commit  # noqa: E402
from sandboxes.docker_api import DockerAPI  # noqa: E402
from tasks.coding.diffs import split_patch  # noqa: E402
from tasks.suite import load_suite  # noqa: E402
from tests.tasks.repo_forgery import REPO_FORGERS, Bug, Built, battery, build  # noqa: E402

PROJECT = "more-itertools==10.5.0"
MORE = "more_itertools/more.py"
TESTS = "tests/test_more.py"
BUGS = [
    Bug("ilen", MORE, "return sum(compress(repeat(1), zip(iterable)))",
        "return sum(compress(repeat(1), zip(iterable))) + 1", TESTS, "IlenTests"),
    Bug("first", MORE, "    if default is _marker:\n        raise ValueError(\n            'first()",
        "    if default is not _marker:\n        raise ValueError(\n            'first()",
        TESTS, "FirstTests"),
    Bug("intersperse", MORE, "return flatten(islice(interleave(filler, chunks), 1, None))",
        "return flatten(islice(interleave(filler, chunks), 0, None))", TESTS, "IntersperseTest"),
]  # fmt: skip


def _project(into: Path) -> Path:
    """The sdist, downloaded once into pqrl's cache, unpacked into ``into``."""
    from tasks.repo.project import fetch_sdist

    found = [fetch_sdist(PROJECT)]
    with tarfile.open(found[0]) as tar:
        tar.extractall(into, filter="data")
    return next(into.iterdir())


def _from_suites(paths: list[str]) -> list[Built]:
    """One ``Built`` per task of the suites: its gold patch's module read from the task's image, so
    a forger lands on the buggy code the agent would start from."""
    out = []
    for path in paths:
        for task in load_suite(path).tasks:
            module = next(
                p.new_path for p in split_patch(task.patch or "") if (p.new_path or "").endswith(".py")
            )
            cat = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat", task.image,
                   f"{task.repo_path}/{module}"]  # fmt: skip
            out.append(
                Built(
                    [task], {module: subprocess.run(cat, capture_output=True, text=True, check=True).stdout}
                )
            )
    return out


async def main(verdict: str, forgers: list[str], suites: list[str]) -> None:
    t0 = time.monotonic()
    if suites:
        parts = _from_suites(suites)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            parts = [
                build(_project(Path(tmp) / "sdist"), BUGS, "pqrl-forge-more-itertools", Path(tmp) / "work")
            ]
    build_s = time.monotonic() - t0
    tasks = [t for part in parts for t in part.tasks]
    for task in tasks:
        print(
            f"# {task.id}: {len(task.fail_to_pass)} FAIL_TO_PASS, {len(task.pass_to_pass)} PASS_TO_PASS",
            flush=True,
        )
    api = DockerAPI()
    try:
        t0 = time.monotonic()
        results: dict = {}
        for part in await asyncio.gather(
            *(battery(api, p, "bench-forgers-repo", verdict, forgers) for p in parts)
        ):
            results.update(part)
        wall_s = time.monotonic() - t0
    finally:
        await api.close()
    counts: dict[str, int] = {}
    unsafe: list[str] = []
    for who in ["gold", "empty", *forgers]:
        rows = {t: r for (w, t), r in results.items() if w == who}
        scored = sorted(t for t, r in rows.items() if not isinstance(r, BaseException) and r.reward > 0)
        raised = sorted(t for t, r in rows.items() if isinstance(r, BaseException))
        verdicts = sorted(
            {str(r.info.get("verdict")) for r in rows.values() if not isinstance(r, BaseException)}
        )
        counts[who] = len(scored) + (len(raised) if who != "gold" else 0)
        print(f"{who}: of {len(rows)} tasks, {len(scored)} scored > 0 {scored}; "
              f"{len(raised)} raised {raised}; verdict {verdicts}", flush=True)  # fmt: skip
        for t in raised:
            print(f"  {t}: {rows[t]!r}", flush=True)
        for t in scored if who not in ("gold",) else []:
            print(f"  {t}: {rows[t].info.get('reason')}", flush=True)
        for t, r in rows.items() if who == "gold" else []:  # --check drops these (tasks/repo/values.py)
            if not isinstance(r, BaseException) and r.info.get("unsafe_fail_to_pass"):
                unsafe.append(t)
                print(f"  {t}: unsafe_fail_to_pass {r.info['unsafe_fail_to_pass']}", flush=True)
    forged = sum(v for k, v in counts.items() if k not in ("gold", "empty"))
    summary = {"verdict": verdict, "tasks": len(tasks), "build_s": round(build_s, 1),
               "wall_s": round(wall_s, 1), "gold_scored": counts["gold"], "empty_scored": counts["empty"],
               "forged_nonzero_or_raised": forged, "counts": counts, "unsafe_tasks": unsafe}  # fmt: skip
    print(json.dumps(summary))


def run(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verdict", choices=("values", "junit"), default="values")
    ap.add_argument("--suite", action="append", default=[], help="a suite of repo tasks (repeatable)")
    ap.add_argument("forgers", nargs="*", default=REPO_FORGERS)
    args = ap.parse_args(argv)
    print(f"# python bench/forgers.py --repo {' '.join(argv)}".rstrip(), flush=True)
    print(f"# commit {short_commit(ROOT)}, load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
    asyncio.run(main(args.verdict, args.forgers, args.suite))


if __name__ == "__main__":
    run(sys.argv[1:])
