"""``pqrl env check ID``: the conformance checker as a command. Prints every rule it checked; exits
0 when all pass, else with UsageError's status, naming the failed rules."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from pqrl.errors import PqrlError, UsageError

if TYPE_CHECKING:
    from env_server.conformance import ConformanceReport

__all__ = ["add_check_arguments", "env_check"]


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("env_id", help="a registered environment id (pqrl env list)")
    p.add_argument("--seed", type=int, default=0, help="the episodes' seed")


def env_check(args: argparse.Namespace) -> int:
    try:
        _report(args.env_id, args.seed)
    except PqrlError as e:  # one line, no traceback, the class's exit status
        print(f"pqrl env check: {e.line()}", file=sys.stderr)
        return e.exit_code
    return 0


def _report(env_id: str, seed: int) -> ConformanceReport:
    from env_server.conformance import check_environment
    from env_server.registry import UnknownEnvironment
    from env_server.sessions import SessionManager

    async def run() -> ConformanceReport:
        manager = SessionManager(pool_size=0)
        try:
            return await check_environment(env_id, manager=manager, seed=seed, raise_on_failure=False)
        finally:
            await manager.shutdown()

    try:
        report = asyncio.run(run())
    except UnknownEnvironment as e:
        raise UsageError(str(e), fix="pqrl env list shows the registered ones") from None
    for rule in report.rules:
        print(rule)
    if not report.ok:
        failed = list(dict.fromkeys(r.name for r in report.rules if not r.passed))
        raise UsageError(
            f"{env_id} fails {len(failed)} rule(s): {'; '.join(failed)}", fix="see the FAIL lines"
        )
    print(f"{env_id}: all {len(report.rules)} rules pass")
    return report
