"""``pqrl tasks import swebench`` and ``pqrl tasks validate --check``: their flags and handlers."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from launcher.errors_cli import positive_int
from launcher.suite_file import check_output, write_suite
from pqrl.errors import RetriesExhausted, UsageError

if TYPE_CHECKING:
    from tasks.suite import Suite

__all__ = [
    "add_check_arguments",
    "add_import_parser",
    "check_suite_command",
    "import_command",
]


def add_import_parser(sources: Any) -> None:
    """``pqrl tasks import swebench``, added to ``sources``: the subcommands of ``pqrl tasks import``."""
    p = sources.add_parser("swebench", help="SWE-bench, SWE-Gym, SWE-smith, R2E-Gym instances")
    p.add_argument("file", help="the instances: JSONL, or a JSON list")
    p.add_argument("-o", "--output", required=True, help="the suite file to write")
    p.add_argument("--name", default=None, help="suite name (default: from the output file's name)")
    p.add_argument("--repos", default=None, help="folder of git clones or bare mirrors (owner__name or name)")
    p.add_argument("--requirements", default=None, help="JSON/YAML: repository -> list of pip specs")
    p.add_argument(
        "--skip-bad", action="store_true", help="leave bad instances out (listed) instead of failing"
    )
    p.add_argument(
        "--verdict",
        choices=("values", "junit"),
        default=None,
        help="the suite's default grading: values (the tests' checked values must match the gold's) or "
        "junit (pytest outcomes alone, which a submission can forge: docs/security.md)",
    )
    p.set_defaults(func=import_command)


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--check", action="store_true", help="run each task's worked example (1) and empty episode (0)"
    )
    p.add_argument("--jobs", type=positive_int, default=4, help="--check: episodes at once")


def import_command(args: argparse.Namespace) -> int:
    from tasks.repo.swebench import ImportFailed, import_swebench, suite_name

    check_output(args.output)  # before any image is built
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        name = args.name or suite_name(args.output)
        result = import_swebench(args.file, name=name, repos=args.repos, requirements=args.requirements,
                                 skip_bad=args.skip_bad, verdict=args.verdict, progress=say)  # fmt: skip
    except ImportFailed as e:
        print("\n".join(str(p) for p in e.problems))
        raise
    for p in result.skipped:
        print(f"skipped {p}")
    write_suite(result.suite, args.output)
    suite = result.suite
    print(f"wrote {suite.id} ({len(suite.tasks)} tasks, {len(result.images_built)} images) to {args.output}")
    return 0


def check_suite_command(suite: Suite, jobs: int) -> None:
    """Runs ``tasks.check`` over ``suite``; prints every failing task and raises UsageError if any."""
    import asyncio

    from tasks.check import check_suite

    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    failures = asyncio.run(check_suite(suite, jobs=jobs, progress=say))
    for f in failures:
        print(f"{'NOT CHECKED' if f.transient else 'FAIL'} {f.task_id}: {f.reason}")
    failed = [f for f in failures if not f.transient]
    if failed:
        raise UsageError(
            f"{suite.id}: {len(failed)} of {len(suite.tasks)} task(s) fail --check, listed above"
        )
    if failures:  # the suite may be fine: the machine could not run these (load, Docker)
        raise RetriesExhausted(
            f"{suite.id}: {len(failures)} of {len(suite.tasks)} task(s) could not be checked, listed above",
            fix="run --check again when the machine is less busy, or with fewer --jobs",
        )
    print(f"{suite.id}: all {len(suite.tasks)} task(s) pass --check (worked example 1, empty episode 0)")
