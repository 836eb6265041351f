"""The command line's one handler of failures: every subcommand's error ends as one line on stderr,
``pqrl <command>: <what happened> (<what to do>)``, and the exit status of its class (pqrl.errors).

The project's own exception types are mapped to those classes here, in one table, not per
subcommand. Anything else is one line with its type and message; ``--debug`` (or ``PQRL_DEBUG=1``)
prints the traceback too. Exit status 1 is also what an unexpected exception gets, as Python's own.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from pqrl.envvars import setting
from pqrl.errors import PermanentFault, PqrlError, RetriesExhausted, UsageError
from pqrl.faults import Fault, fix_for, fix_for_code
from pqrl.faults import classify as fault_class

__all__ = ["Parser", "classify", "command_name", "debugging", "one_line", "positive_int", "run_command"]

_PATH = "check the path"
_REDIS = "start Redis, or check --redis-url / PQRL_REDIS_URL"
# (module, class) -> (pqrl.errors class, what to do), first match wins: subclasses before their bases.
# A module not imported yet cannot have raised, so nothing here imports anything.
_KNOWN: list[tuple[str, str, type[PqrlError], str]] = [
    # fmt: off
    ("tasks.suite", "SuiteInvalid", UsageError, "pqrl tasks validate FILE lists every problem"),
    ("launcher.jobconfig", "ConfigInvalid", UsageError, "pqrl train --explain lists every field"),
    ("pydantic_core", "ValidationError", UsageError, "check the values given"),
    ("env_server.registry", "UnknownEnvironment", PermanentFault, "pqrl env list shows the registered ones"),
    ("pqrl.model_cache", "ModelNotAvailable", PermanentFault, ""),  # its message says what to give
    ("pqrl.store.connection", "Backpressure", RetriesExhausted, "let the trainer catch up, then retry"),
    ("pqrl.store.connection", "StoreUnavailable", RetriesExhausted, _REDIS),
    ("redis.exceptions", "AuthenticationError", PermanentFault, "give the password in the Redis URL"),
    ("redis.exceptions", "ConnectionError", RetriesExhausted, _REDIS),
    ("redis.exceptions", "TimeoutError", RetriesExhausted, _REDIS),
    ("pqrl.redis_server", "RedisServerError", PermanentFault, "install redis-server (scripts/setup.sh does)"),
    ("engine.sglang", "SGLangNotInstalled", PermanentFault, "install the sglang extra, or --backend builtin"),
    ("engine.errors", "EngineHTTPError", PermanentFault, "see the engine's log"),
    ("engine.errors", "EngineError", RetriesExhausted, "start the engine, or check --engine"),
    ("env_server.client", "AuthError", PermanentFault, "give the env server's token (PQRL_ENV_TOKEN)"),
    ("env_server.client", "EnvUnavailable", RetriesExhausted, "start the env server, or check --env-server"),
    ("env_server.sessions", "NotFound", PermanentFault, ""),  # an unknown environment: it lists the known
    ("env_server.sessions", "TooManySessions", RetriesExhausted, "retry later, or raise the server's limit"),
    ("env_server.sessions", "EnvServerError", PermanentFault, "see the env server's log"),
    ("sandboxes.protocol", "ImageMissing", PermanentFault, "pqrl sandbox build-image builds it"),
    ("sandboxes.protocol", "SandboxUnavailable", PermanentFault, ""),  # it says how to start dockerd
    ("sandboxes.protocol", "SandboxError", PermanentFault, "see the Docker engine's log"),
    ("sandboxes.image", "ImageBuildError", PermanentFault, ""),  # its message says what is missing
    ("tasks.coding.grader", "GoldReferenceError", PermanentFault, "its gold patch must pass its tests"),
    ("httpx", "HTTPStatusError", PermanentFault, "see the server's log"),
    ("httpx", "TransportError", RetriesExhausted, "start the server, or check its URL"),
    ("builtins", "FileNotFoundError", UsageError, _PATH),
    ("builtins", "IsADirectoryError", UsageError, _PATH),
    ("builtins", "NotADirectoryError", UsageError, _PATH),
    ("builtins", "PermissionError", UsageError, "check the path's permissions"),
    ("builtins", "ConnectionError", RetriesExhausted, "start the server, or check its URL"),
    # fmt: on
]


def _known_type(module: str, name: str) -> type | None:
    mod = sys.modules.get(module)
    found = getattr(mod, name, None) if mod is not None else None
    return found if isinstance(found, type) else None


def _chain(e: BaseException) -> Iterator[BaseException]:
    """``e``, then what caused it, then what it happened while handling; the first of a group."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        if isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        else:
            e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)  # type: ignore[assignment]


def one_line(text: str, *, keep: int = 4) -> str:
    """``text`` on one line: its lines joined by ``; ``, the first ``keep`` after the head, then a count."""
    lines = [s.strip() for s in str(text).splitlines() if s.strip()]
    if len(lines) > keep + 1:
        lines = [*lines[: keep + 1], f"... {len(lines) - keep - 1} more"]
    out = lines[0] if lines else "(no message)"
    for prev, line in zip(lines, lines[1:], strict=False):
        out += (" " if prev.endswith(":") else "; ") + line
    return out


def _status(e: BaseException) -> int | None:
    status = getattr(e, "status", None)
    if status is None:
        status = getattr(getattr(e, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def classify(e: BaseException) -> PqrlError | None:
    """The ``PqrlError`` that ``e`` amounts to: the outermost one in its chain of causes, else the
    first row of the table that any of the chain matches; None when no class is known."""
    chain = list(_chain(e))
    for link in chain:
        if isinstance(link, PqrlError):
            return link
    for module, name, cls, fix in _KNOWN:
        t = _known_type(module, name)
        if t is None:
            continue
        for link in chain:
            if isinstance(link, t):
                status = _status(link)
                if status is not None:  # an HTTP answer: its class is the rollout paths' (pqrl.faults)
                    code = str(getattr(link, "code", "") or "")
                    cls = RetriesExhausted if fault_class(status, code) is Fault.TRANSIENT else PermanentFault
                    fix = fix_for_code(code) or fix or fix_for(link)
                return cls(one_line(str(link) or type(link).__name__), fix=fix)
    return None


def command_name(args: argparse.Namespace | None) -> str:
    """``pqrl tasks filter``: the program and the subcommand words that ``args`` chose."""
    words = ["pqrl"]
    command = getattr(args, "command", None)
    if command:
        words.append(command)
        sub = getattr(args, f"{command}_command", None)
        if sub:
            words.append(sub)
    return " ".join(words)


def debugging(argv: list[str]) -> tuple[bool, list[str]]:
    """Whether ``--debug`` (anywhere before ``--``) or ``PQRL_DEBUG`` asks for tracebacks, and
    ``argv`` without it."""
    cut = argv.index("--") if "--" in argv else len(argv)
    flagged = "--debug" in argv[:cut]
    rest = [a for i, a in enumerate(argv) if not (i < cut and a == "--debug")]
    return flagged or (setting("PQRL_DEBUG") or "0") not in ("0", "", "false", "no"), rest


def run_command(func: Callable[[argparse.Namespace], Any], args: argparse.Namespace, *, debug: bool) -> int:
    """Runs one subcommand; a failure becomes its one line on stderr and its class's exit status."""
    name = command_name(args)
    if getattr(args, "quiet", False):
        from launcher.quiet import be_quiet

        be_quiet()
    try:
        return int(func(args) or 0)
    except BrokenPipeError:  # the reader of stdout went away (| head): nothing is wrong, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130  # the shell's status for a SIGINT; no class of ours
    except SystemExit as e:
        if isinstance(e.code, str):  # a command's own one line
            print(one_line(e.code), file=sys.stderr)
            return int(getattr(e, "status", 1))  # a dead child's class (launcher.children.ChildDied)
        raise
    except BaseException as e:  # noqa: BLE001 - the one place every failure ends up
        if debug:
            traceback.print_exception(e, file=sys.stderr)
        known = classify(e)
        if known is not None:
            print(f"{name}: {one_line(known.line())}", file=sys.stderr)
            return known.exit_code
        hint = "" if debug else " (run with --debug for the traceback)"
        print(f"{name}: {type(e).__name__}: {one_line(str(e))}{hint}", file=sys.stderr)
        return 1
    finally:
        sys.stderr.flush()


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


class Parser(argparse.ArgumentParser):
    """argparse whose refusal of a flag is one line (``pqrl tasks list: ... (see --help)``), status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(UsageError.exit_code, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")
