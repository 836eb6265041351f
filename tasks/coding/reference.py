"""The gold record of a task's rewritten tests, from test runs the caller performs in containers.

Shared by coding-v1 (tasks/coding/grader.py: the repository as files on the host) and repo-v1
(tasks/repo/values.py: the repository in an image): how each checks out the unfixed code and the
gold solution differs, what is run and what is kept on the host does not. In order:

1. the hidden tests rewritten in full (tasks/coding/probes.py);
2. if some operand could be held (tasks/coding/held.py), the rewritten tests on the unfixed
   code (the *base*): which operands the fix changes;
3. the rewritten tests on the gold solution (``first``), then again with the held operands left
   out as a submission runs them (``second``): what varies between runs, and whether leaving
   them out changed what the gold code passes (then nothing is held and the second run repeats
   in full).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from pqrl.faults import BadTask
from tasks.coding import probes
from tasks.coding.held import base_fails, could_hold, held_operands, settle
from tasks.coding.record import Record
from tasks.coding.verdict import Reference

__all__ = ["GoldReferenceError", "ast_work", "build_reference", "gold_runs_apart"]

T = TypeVar("T")
_AST_LOCK = threading.Lock()

RunTests = Callable[[Mapping[str, str]], Awaitable[Record]]


async def ast_work(fn: Callable[..., T], *args: Any) -> T:
    """Parsing is CPU work: off the event loop, so rollouts sharing it never wait on it. One at a
    time: CPython 3.11's ast module keeps recursion state per interpreter, and concurrent parses in
    threads fail with "AST constructor recursion depth mismatch"."""

    def locked() -> T:
        with _AST_LOCK:
            return fn(*args)

    return await asyncio.to_thread(locked)


class GoldReferenceError(BadTask, RuntimeError):
    """The gold solution does not pass its own rewritten tests: the task (or the grader) is broken,
    never the submission's fault; a ``BadTask``, so the task is dead-lettered, not retried."""


def gold_runs_apart(
    make_sandbox: Callable[[], Awaitable[Any]], run: Callable[[Any, Mapping[str, str]], Awaitable[Record]]
) -> RunTests:
    """``run_gold`` for ``build_reference``: ``run(sandbox, files)`` in a sandbox of its own each
    time (closed after), as a submission's run always is. What differs from one container to the
    next (its host name, a folder on PYTHONPATH, so os.environ) then differs between the gold runs
    too and is unstable, not a check the gold passes and every submission fails."""

    async def run_gold(files: Mapping[str, str]) -> Record:
        box = await make_sandbox()
        try:
            return await run(box, files)
        finally:
            await box.close()

    return run_gold


async def build_reference(
    name: str,
    hidden: Mapping[str, str],
    tests: list[str],
    run_base: Callable[[Mapping[str, str]], Awaitable[Record | None]],
    run_gold: RunTests,
    *,
    always_base: bool = False,
) -> Reference:
    """The reference of ``hidden`` (path -> source of the test files to rewrite) for the listed
    ``tests``. ``run_base(files)``: the record of ``files`` over the unfixed code, None when there
    is none (the base is only evidence); ``run_gold(files)``: the record over the gold solution,
    raising GoldReferenceError when the gold fails a listed test. ``always_base``: run the base
    even when no operand could be held (its ``base_fails`` tell which tests a forger must forge)."""
    full = await ast_work(probes.instrument, dict(hidden))
    base = await run_base(full.files) if always_base or could_hold(full.sites) else None
    first = await run_gold(full.files)
    held = held_operands(full.sites, first, base) if base is not None else {}
    settled, reduced = None, full
    if held:
        reduced = await ast_work(probes.instrument, dict(hidden), held)
        try:
            settled = settle(reduced.sites, first, await run_gold(reduced.files), tests)
        except GoldReferenceError:
            settled = None
    if settled is None:
        settled = settle(full.sites, first, await run_gold(full.files), tests)
    if settled is None:
        raise GoldReferenceError(f"task {name}: the gold patch fails its own rewritten checks")
    if not settled.held:
        final = full
    elif settled.held == held:  # every held operand stood: the second run's rewriting is final
        final = reduced
    else:
        final = await ast_work(probes.instrument, dict(hidden), settled.held)
    fails = base_fails(first, base) if base is not None else None
    return Reference(final.files, final.sites, first, settled.unstable, settled.unstable_tests, fails)
