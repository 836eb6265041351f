"""The engine of a command: the backend it names (``--backend``), and the client of engines at URLs,
built once they answer and only after they answer as the kind named (``engine.backends``)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["BACKEND_CHOICES", "add_backend_argument", "connect_engines", "started_engine"]

BACKEND_CHOICES = ("auto", "builtin", "sglang", "vllm")
WAIT_S = 1800.0  # how long an engine is waited for (to answer /health, or under auto to say its kind)


def add_backend_argument(p: argparse.ArgumentParser, *, starts: bool) -> None:
    """``--backend``: which engine a URL is (auto: asked), and with ``starts`` which one to start."""
    started = (
        "; without --engine, the engine started here (auto: builtin)"
        if starts
        else "; an engine not answering yet is taken to be the one named (auto waits for an answer)"
    )
    p.add_argument(
        "--backend",
        choices=BACKEND_CHOICES,
        default="auto",
        help="the engine's kind: builtin or sglang (SGLang's API) or vllm; with --engine URL, checked "
        f"against what the server answers (auto: taken from it){started}",
    )


async def connect_engines(
    urls: str | Sequence[str],
    backend: str,
    children: Any,
    *,
    timeout_s: float | None = None,
    stop: Any = None,
    named_by: str = "--backend",
) -> Any:
    """The client of the engines at ``urls``, of the class their kind needs. With ``children``
    (``launcher.children.Children``, watching the ones started here) once each answers ``/health``
    (every backend has it); without, at once: an engine not answering yet is taken to be of the kind
    named (``auto`` waits up to ``timeout_s`` for every engine to answer). ``UsageError`` when an
    engine is not of the kind named (``named_by``: where the user names it, for the fix)."""
    import asyncio

    from engine.backends import checked_urls, engine_backend, engine_client
    from engine.client import EngineClient

    urls = checked_urls(urls)
    timeout_s = WAIT_S if timeout_s is None else timeout_s
    if children is None and backend == "auto":  # a worker started beside its engine waits for it
        return await _asked(urls, timeout_s, named_by)
    if children is not None:
        probe = EngineClient(urls)
        try:

            async def healthy() -> bool:
                return all((await probe.health()).values())

            what = "the engine" + "s" * (len(urls) > 1)
            await children.wait_until(healthy, what=what, timeout_s=timeout_s, stop=stop or asyncio.Event())
        finally:
            await probe.aclose()
    return engine_client(urls, await engine_backend(urls, backend, named_by=named_by))


async def _asked(urls: list[str], timeout_s: float, named_by: str) -> Any:
    """The client of ``urls`` once every engine has said its kind, asked every few seconds (an
    engine still loading, a proxy before it answering 5xx) for up to ``timeout_s``, with a line to
    stderr each minute."""
    import asyncio
    import sys
    import time

    from engine.backends import engine_backend, engine_client, served_api

    t0 = time.monotonic()
    said = t0
    while True:
        apis = await asyncio.gather(*(served_api(u) for u in urls))
        if None not in apis or time.monotonic() - t0 > timeout_s:
            # the kinds just answered are asked once more by engine_backend, which names any missing
            return engine_client(urls, await engine_backend(urls, "auto", named_by=named_by))
        if time.monotonic() - said > 60:
            said = time.monotonic()
            waiting = [u for u, a in zip(urls, apis, strict=True) if a is None]
            print(f"waiting for the engine at {', '.join(waiting)} to answer ({said - t0:.0f}s)",
                  file=sys.stderr, flush=True)  # fmt: skip
        await asyncio.sleep(2.0)


@contextlib.contextmanager
def started_engine(model: str, backend: str, log: Path, children: Any, *, threads: int) -> Iterator[str]:
    """An engine of ``backend`` (auto: builtin) serving ``model`` on a free loopback port, in a process
    of its own that ``children`` watches, writing ``log``; yields its URL, stops it after."""
    from launcher.services import engine_process
    from pqrl.redis_server import free_port

    port = free_port()
    kind = "builtin" if backend == "auto" else backend
    with engine_process(model, port, log, threads=threads, backend=kind) as proc:
        children.add("engine", proc, log)
        yield f"http://127.0.0.1:{port}"
