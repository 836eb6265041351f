"""``pqrl tasks import harbor DIR -o SUITE.jsonl``: Harbor task directories to a suite."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_import_harbor"]


def add_import_harbor(sources: Any) -> None:
    """``pqrl tasks import harbor``, added to ``sources``: the subcommands of ``pqrl tasks import``."""
    p = sources.add_parser("harbor", help="Harbor (Terminal-Bench) task directories")
    p.add_argument("dir", help="a task directory, or a directory of them")
    p.add_argument("-o", "--output", required=True, help="the suite file to write")
    p.add_argument("--name", default=None, help="suite name (default: the directory's name)")
    p.set_defaults(func=_cmd_import_harbor)


def _cmd_import_harbor(args: argparse.Namespace) -> int:
    from launcher.suite_file import check_output, write_suite
    from pqrl.errors import UsageError
    from tasks.harbor.importer import HarborInvalid, import_harbor

    check_output(args.output)  # before any image is built
    try:
        suite = import_harbor(args.dir, name=args.name, progress=lambda m: print(m, file=sys.stderr))
    except HarborInvalid as e:  # every problem on its own line (the result); the handler's line sums up
        for problem in e.problems:
            print(problem)
        raise UsageError(f"{args.dir}: {len(e.problems)} problem(s), nothing written", fix=e.fix) from None
    out = write_suite(suite, args.output)
    print(f"wrote {suite.id} ({len(suite.tasks)} tasks) to {out}")
    return 0
