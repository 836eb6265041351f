"""``pqrl tasks generate coding --from-sdist NAME==VERSION | --from-repo PATH``: repo tasks made from
a real project's own tests by injected bugs (tasks/repo/generate.py)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from launcher.errors_cli import positive_int
from pqrl.errors import UsageError

__all__ = ["add_generate_arguments", "from_project", "generate_command"]


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from-sdist",
        metavar="NAME==VERSION",
        default=None,
        help="coding: bugs in this PyPI sdist (it must ship its tests), graded by them",
    )
    p.add_argument(
        "--from-repo", metavar="PATH", default=None, help="coding: a local project (git or folder)"
    )
    p.add_argument("--max-tasks", type=positive_int, default=50, help="--from-*: tasks at most")
    p.add_argument("--per-function", type=positive_int, default=1, help="--from-*: bugs per function at most")
    p.add_argument(
        "--requirements",
        action="append",
        default=[],
        metavar="SPEC",
        help="--from-*: a pip spec the tests need (repeatable; their imports are inferred)",
    )
    p.add_argument(
        "--workers", type=positive_int, default=2, help="--from-*: sandboxes running tests at once"
    )
    p.add_argument(
        "--no-infer",
        dest="infer",
        action="store_false",
        help="--from-*: install only the declared dependencies and --requirements, no guesses from imports",
    )
    p.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="--from-*: keep tasks without running each as validate --check does (gold 1, empty 0)",
    )


def from_project(args: argparse.Namespace) -> bool:
    """Whether this ``pqrl tasks generate`` generates from a real project."""
    wanted = bool(args.from_sdist or args.from_repo)
    if wanted and args.kind != "coding":
        raise UsageError(
            "--from-sdist and --from-repo make coding tasks", fix="pqrl tasks generate coding ..."
        )
    if args.from_sdist and args.from_repo:
        raise UsageError("give --from-sdist or --from-repo, not both")
    return wanted


def generate_command(args: argparse.Namespace) -> int:
    from launcher.suite_file import check_output, write_suite
    from tasks.repo.generate import Options, generate_tasks
    from tasks.repo.project import fetch_sdist, infer_requirements, load_project

    check_output(args.output)  # before anything is downloaded or built
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if args.from_sdist:
        source, name, origin = fetch_sdist(args.from_sdist), args.from_sdist.split("==")[0], args.from_sdist
    else:
        path = Path(args.from_repo).resolve()
        source, name, origin = path, path.name, path.name
    with tempfile.TemporaryDirectory(prefix="pqrl-project-") as tmp:
        project = load_project(source, name, origin, Path(tmp, "tree"))
        reqs = tuple(sorted({*infer_requirements(project, infer=args.infer), *args.requirements}))
        say(
            f"{origin}: {len(project.sources)} source files, {len(project.tests)} test files, "
            f"requirements {list(reqs) or 'none'}"
        )
        opts = Options(
            seed=args.seed,
            max_tasks=args.max_tasks,
            per_function=args.per_function,
            requirements=reqs,
            workers=args.workers,
            name=args.name,
            check=args.check,
        )
        result = generate_tasks(project, opts, say)
    write_suite(result.suite, args.output)
    s = result.stats
    checked = f", {len(s['dropped'])} dropped by the check" if args.check else ", not checked"
    print(
        f"wrote {result.suite.id} ({len(result.suite.tasks)} tasks; {s['tried']} mutants tried, "
        f"{s['cached']} from cache{checked}) to {args.output}"
    )
    return 0
