"""``pqrl rollout`` and ``pqrl trajectories show``: thin command bodies over the rollout code."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from launcher.quiet import QUIET_HELP
from pqrl.envvars import redis_url, setting
from pqrl.errors import JobEnded, UsageError

__all__ = ["add_rollout_arguments", "filter_tasks", "local_engine", "rollout", "show_trajectories"]


def add_rollout_arguments(p: argparse.ArgumentParser) -> None:
    """Where to connect, plus one flag per setting of the manager and its episodes (declared there)."""
    from agent_loop.config import EpisodeConfig, ManagerConfig
    from launcher.engine_choice import add_backend_argument
    from launcher.model_io import add_template_arguments
    from pqrl.model_cache import DEFAULT_MODEL
    from pqrl.settings import add_arguments

    p.add_argument("--redis-url", default=None, help="default: $PQRL_REDIS_URL")
    p.add_argument("--run", required=True)
    p.add_argument("--engine", action="append", required=True, help="engine URL (repeatable)")
    add_backend_argument(p, starts=False)
    p.add_argument(
        "--env-server", action="append", default=[], help="env server URL (repeatable); default: in process"
    )
    p.add_argument("--env-token", default=None, help="default: $PQRL_ENV_TOKEN")
    p.add_argument("--model", default=DEFAULT_MODEL, help="tokenizer / chat template of the policy")
    add_template_arguments(p)
    p.add_argument(
        "--forever", action="store_true", help="keep waiting for tasks instead of stopping when empty"
    )
    p.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    add_arguments(p, ManagerConfig)
    add_arguments(p, EpisodeConfig)


def rollout(args: argparse.Namespace) -> int:
    from agent_loop.config import EpisodeConfig, ManagerConfig
    from agent_loop.manager import RolloutManager
    from env_server.client import HttpEnvClient, LocalEnvClient
    from launcher.engine_choice import connect_engines
    from launcher.model_io import renderer_from_args
    from pqrl.settings import from_arguments
    from pqrl.store import TrajectoryStore

    # --quiet: the result, or the one line of the failure that ended the command (printed by the CLI)
    level = logging.CRITICAL if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the progress
    url = redis_url(args.redis_url)
    cfg = from_arguments(ManagerConfig, args, episode=from_arguments(EpisodeConfig, args))

    async def main() -> int:
        # an engine not up yet is taken to be the kind named (auto: waited for, then asked)
        engine = await connect_engines(args.engine, args.backend, None)
        store = TrajectoryStore(url, args.run)
        token = args.env_token or setting("PQRL_ENV_TOKEN")
        env = HttpEnvClient(args.env_server, token=token) if args.env_server else LocalEnvClient()
        manager = RolloutManager(store, engine, env, renderer_from_args(args, args.model), cfg)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # finish the groups in flight, then exit
            loop.add_signal_handler(sig, manager.stop)
        try:
            stats = await manager.run(until_empty=not args.forever)
        finally:
            await engine.aclose()
            await env.aclose()
            await store.close()
        print(
            f"groups written {stats.groups_written}, dropped {stats.groups_dropped}, "
            f"failures {dict(stats.failures)}"
        )
        return 0

    return asyncio.run(main())


def show_trajectories(args: argparse.Namespace) -> int:
    """Prints stored groups as the trainer will see them, without consuming them."""
    from pqrl.codec import CodecError
    from pqrl.model_cache import load_tokenizer
    from pqrl.store import TrajectoryStore

    url = redis_url(args.redis_url)
    tokenizer = load_tokenizer(args.model)

    async def fetch() -> list[tuple[str, Any]]:
        async with TrajectoryStore(url, args.run) as store:
            return await store.groups.peek(args.groups)

    figures: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for entry_id, group in asyncio.run(fetch()):
        if isinstance(group, CodecError):
            print(f"== entry {entry_id}: undecodable: {group}")
            continue
        print(f"== group {group[0].group_id} (entry {entry_id}), task {group[0].task_id}, env {group[0].env}")
        for t in group:
            _figures(figures[t.env], t)
            counts = f"{t.num_tokens} tokens ({t.num_generated} generated, {int(t.loss_mask.sum())} trained)"
            print(f"-- {t.id}: status {t.status.value}, reward {t.reward:g}, {len(t.turns)} turns, {counts}")
            if not args.brief:
                print(_render(tokenizer, t))
    for env, c in figures.items():
        n = max(c["trajectories"], 1)
        calls = max(c["tool_calls"], 1)
        print(
            f"[{env}] {c['trajectories']} trajectories: response length {c['generated'] / n:.1f} tokens, "
            f"turns {c['turns'] / n:.2f}, tool error rate {c['tool_errors'] / calls:.2f}, "
            f"truncated {c['truncated'] / n:.2f}, failed_infra {c['failed_infra'] / n:.2f}"
        )
    return 0


def _figures(c: collections.Counter[str], t: Any) -> None:
    from pqrl.trajectory import Status, ToolStatus

    c["trajectories"] += 1
    c["generated"] += t.num_generated
    c["turns"] += len(t.turns)
    c["truncated"] += t.truncation is not None
    c["failed_infra"] += t.status is Status.FAILED_INFRA
    for u in t.turns:
        c["tool_calls"] += len(u.tool_calls)
        c["tool_errors"] += sum(call.status is not ToolStatus.OK for call in u.tool_calls)


def _render(tokenizer: Any, t: Any) -> str:
    """The token stream in runs: ``[prompt]``/``[obs]`` (mask 0), ``[gen vN]`` (trained),
    ``[gen vN masked]`` (generated, not trained), ``[closing]`` (appended turn-closing tokens)."""
    out = []
    i, n = 0, t.num_tokens
    while i < n:
        g, m, v = int(t.generated[i]), int(t.loss_mask[i]), int(t.versions[i])
        j = i
        while j < n and (int(t.generated[j]), int(t.loss_mask[j]), int(t.versions[j])) == (g, m, v):
            j += 1
        tag = (f"gen v{v}" + ("" if m else " masked")) if g else ("prompt" if i < t.prompt_len else "obs")
        out.append(f"[{tag}]{tokenizer.decode(np.asarray(t.tokens[i:j]).tolist())}")
        i = j
    return "".join(out)


@contextlib.contextmanager
def local_engine(model: str) -> Iterator[str]:
    """The built-in engine served on a free loopback port from a background thread; yields its URL."""
    from engine.config import EngineConfig
    from engine.http_app import create_app
    from engine.serve_command import build_engine
    from engine.thread_server import serve_in_thread

    with serve_in_thread(create_app(build_engine(EngineConfig(model=model)), model_path=model)) as url:
        yield url


def filter_tasks(args: argparse.Namespace) -> int:
    """``pqrl tasks filter``: pass rates with the given policy, a table of them and the filtered suite.

    Keeping no task ends the command as ``JobEnded`` (status 1) with no file written: the inputs were
    valid, the run found nothing to train on, as a training job whose plan is used up."""
    from agent_loop.config import EpisodeConfig
    from agent_loop.difficulty import rewards_that_ran, run_samples
    from env_server.client import LocalEnvClient
    from launcher.children import Children
    from launcher.engine_choice import connect_engines, started_engine
    from launcher.model_io import renderer_from_args
    from launcher.suite_file import write_suite
    from pqrl.settings import from_arguments
    from tasks.difficulty import distribution_table, filter_suite, pass_rates, task_table
    from tasks.suite import load_suite

    suite = load_suite(args.suite)
    if not 0.0 <= args.low < args.high <= 1.0:
        raise UsageError(f"--low {args.low:g} --high {args.high:g}", fix="need 0 <= low < high <= 1")
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
        raise UsageError(f"-o {args.output}: {out_dir} is not a writable directory", fix="check the path")
    cfg = from_arguments(EpisodeConfig, args)

    def progress(done: int, total: int) -> None:
        if args.quiet:
            return
        if done % max(1, total // 20) == 0 or done == total:
            print(f"\r  {done}/{total} episodes", end="", file=sys.stderr, flush=True)

    children = Children(quiet=args.quiet, command="pqrl tasks filter")

    async def run(url: str) -> dict[str, list[float]]:
        engine, env = await connect_engines(url, args.backend, children), LocalEnvClient()
        try:
            renderer = renderer_from_args(args, args.model)
            ran = await run_samples(suite, engine=engine, env=env, renderer=renderer,
                                    samples=args.samples, cfg=cfg, progress=progress)  # fmt: skip
            return rewards_that_ran(ran)
        finally:
            await engine.aclose()
            await env.aclose()

    if args.engine:
        rewards = asyncio.run(run(args.engine))
    elif args.backend in ("auto", "builtin"):
        with local_engine(args.model) as url:
            rewards = asyncio.run(run(url))
    else:  # vLLM or SGLang: a server process of its own, its log kept where a failure names it
        log = Path(tempfile.mkdtemp(prefix="pqrl-filter-")) / "engine.log"
        with started_engine(args.model, args.backend, log, children, threads=os.cpu_count() or 1) as url:
            rewards = asyncio.run(run(url))
        if (died := children.death()) is not None:
            raise died
    if not args.quiet:
        print(file=sys.stderr)
    rates = pass_rates(rewards)  # a task whose every episode failed on infrastructure has none
    never = len(suite.tasks) - len(rates)
    if not rates:
        raise JobEnded(f"no pass rate: no task ran, all {never} failed on infrastructure; nothing written",
                       fix="pqrl env check, or the env server's log, says why")  # fmt: skip
    ran = dataclasses.replace(suite, tasks=tuple(t for t in suite.tasks if t.id in rates))
    kept = filter_suite(ran, rates, low=args.low, high=args.high)
    if never:
        print(f"pqrl tasks filter: {never} of {len(suite.tasks)} tasks never ran (their episodes failed on "
              "infrastructure): left out, not rated", file=sys.stderr)  # fmt: skip
    print(f"{suite.id}: {args.samples} samples per task with {args.model}")
    print(task_table(rates, {t.id for t in kept.tasks}))
    print(distribution_table(rates))
    mean = f"mean pass rate {sum(rates.values()) / max(len(rates), 1):.3f}"
    if not kept.tasks:
        fix = "filter a suite this policy sometimes solves, or sample more (--samples)"
        raise JobEnded(
            f"no task has a pass rate in ({args.low:g}, {args.high:g}) ({mean}); nothing written", fix=fix
        )
    write_suite(kept, args.output)
    print(f"{mean}; wrote {kept.id} ({len(kept.tasks)} of {len(suite.tasks)} tasks) to {args.output}")
    return 0
