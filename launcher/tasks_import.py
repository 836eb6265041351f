"""``pqrl tasks import swebench`` and ``pqrl tasks validate --check``: their flags and handlers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors_cli import positive_int
from pqrl.errors import UsageError

if TYPE_CHECKING:
    from tasks.suite import Suite

__all__ = [
    "add_check_arguments",
    "add_import_parser",
    "check_suite_command",
    "import_command",
    "write_whole",
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
    p.set_defaults(func=import_command)


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--check", action="store_true", help="run each task's worked example (1) and empty episode (0)"
    )
    p.add_argument("--jobs", type=positive_int, default=4, help="--check: episodes at once")


def import_command(args: argparse.Namespace) -> int:
    from tasks.repo.swebench import ImportFailed, import_swebench, suite_name

    out = Path(args.output)
    if not out.parent.is_dir():  # before any image is built
        raise UsageError(f"-o {args.output}: the folder {out.parent} does not exist")
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        name = args.name or suite_name(args.output)
        result = import_swebench(args.file, name=name, repos=args.repos, requirements=args.requirements,
                                 skip_bad=args.skip_bad, progress=say)  # fmt: skip
    except ImportFailed as e:
        print("\n".join(str(p) for p in e.problems))
        raise
    for p in result.skipped:
        print(f"skipped {p}")
    write_whole(out, result.suite.to_jsonl(), f"-o {args.output}")
    suite = result.suite
    print(f"wrote {suite.id} ({len(suite.tasks)} tasks, {len(result.images_built)} images) to {args.output}")
    return 0


def write_whole(out: Path, text: str, flag: str) -> None:
    """Writes ``out`` whole or not at all (a partial file beside it, renamed over it)."""
    partial = out.with_name(f".{out.name}.partial")
    try:
        partial.write_text(text)
        partial.replace(out)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise UsageError(f"{flag} cannot be written: {e}") from None


def check_suite_command(suite: Suite, jobs: int) -> None:
    """Runs ``tasks.check`` over ``suite``; prints every failing task and raises UsageError if any."""
    import asyncio

    from tasks.check import check_suite

    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    failures = asyncio.run(check_suite(suite, jobs=jobs, progress=say))
    for f in failures:
        print(f"FAIL {f.task_id}: {f.reason}")
    if failures:
        raise UsageError(
            f"{suite.id}: {len(failures)} of {len(suite.tasks)} task(s) fail --check, listed above"
        )
    print(f"{suite.id}: all {len(suite.tasks)} task(s) pass --check (worked example 1, empty episode 0)")
