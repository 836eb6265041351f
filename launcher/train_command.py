"""``pqrl train CONFIG``: one command for a whole training job.

Embedded mode (no service URLs in the config): a private Redis whose data lives in the run
directory (so a killed job resumes with its stream), the built-in engine as a separate process
(weights updated through ``/update_weights_from_disk``), environments in this process, the rollout
manager and the trainer, sharing this machine's cores as the config says. Distributed mode: the
same job against given Redis / engine / env-server URLs; ``--role trainer`` or ``--role rollout``
runs one side, so rollout workers and trainers can sit on different machines.

A job always resumes from its latest checkpoint when the run directory has one (``--fresh``
starts over). The trainer writes ``metrics.jsonl``, TensorBoard events, ``curves.png`` at the end,
and its figures to Redis for ``pqrl status``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import time
from typing import Any

import yaml

from launcher.jobconfig import ConfigInvalid, TrainConfig, explain_lines, explain_markdown, load_config
from launcher.quiet import QUIET_HELP
from pqrl.envvars import checked_redis_url, setting
from pqrl.errors import PqrlError, UsageError
from pqrl.yaml_text import load_yaml

__all__ = ["add_train_arguments", "train_command"]

log = logging.getLogger("pqrl.train")


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="the job's YAML config (see --explain)")
    p.add_argument(
        "--role",
        choices=["all", "trainer", "rollout"],
        default="all",
        help="distributed mode: run only the trainer or only a rollout manager",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field, e.g. --set train.steps=5 (value parsed as YAML)",
    )
    # where this process finds the run's services: one config file serves every machine of a run
    p.add_argument(
        "--redis-url", default=None, help="the run's Redis (default $PQRL_REDIS_URL, else the config's)"
    )
    p.add_argument(
        "--engine",
        action="append",
        default=None,
        metavar="URL",
        help="an engine URL, repeatable (default $PQRL_ENGINES, comma-separated, else the config's)",
    )
    p.add_argument(
        "--env-server",
        action="append",
        default=None,
        metavar="URL",
        help="an env-server URL, repeatable (default $PQRL_ENV_SERVERS, else the config's; "
        "token $PQRL_ENV_TOKEN)",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="delete the run directory and start over (distributed: also gives the run this config's "
        "shared settings)",
    )
    p.add_argument("--explain", action="store_true", help="list every config field and exit")
    p.add_argument("--markdown", action="store_true", help="with --explain: as the table of docs/config.md")
    p.add_argument("--quiet", action="store_true", help=QUIET_HELP)


def _overrides(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigInvalid(f"--set {pair!r}: expected FIELD=VALUE")
        out[key] = load_yaml(value)
    return out


def _service_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The services flags, else the ``PQRL_*`` environment variables, as config overrides."""

    def urls(flag: list[str] | None, var: str) -> list[str] | None:
        given = flag or [u.strip() for u in (setting(var) or "").split(",") if u.strip()]
        return given or None

    found = {
        "services.redis_url": args.redis_url or setting("PQRL_REDIS_URL"),
        "services.engines": urls(args.engine, "PQRL_ENGINES"),
        "services.env_servers": urls(args.env_server, "PQRL_ENV_SERVERS"),
    }
    return {k: v for k, v in found.items() if v is not None}


def train_command(args: argparse.Namespace) -> int:
    args.started = time.monotonic()  # the job's time counts from here: services start-up included
    if args.explain:
        print(explain_markdown() if args.markdown else "\n".join(explain_lines()) + "\n", end="")
        return 0
    if not args.config:
        print("pqrl train: give a CONFIG file (pqrl train --explain lists its fields)", file=sys.stderr)
        return 2
    if not os.path.isfile(args.config):
        raise UsageError(f"{args.config}: no such file", fix="check the path")
    cfg = load_config(args.config, _overrides(args.set) | _service_overrides(args))  # ConfigInvalid: status 2
    from trainer.trackers import require

    if args.role != "rollout":  # the trainer logs; a missing package: one line now, not after loading
        require(cfg.train.report_to)
    if cfg.services.redis_url:
        checked_redis_url(cfg.services.redis_url)
    if cfg.embedded and args.role != "all":
        print("pqrl train: --role needs the run's Redis (--redis-url, $PQRL_REDIS_URL or services.redis_url)",
              file=sys.stderr)  # fmt: skip
        return 2
    if not cfg.embedded and args.role != "trainer" and not cfg.services.engines:
        print("pqrl train: rollouts on a shared Redis need engines (--engine, $PQRL_ENGINES or "
              "services.engines)", file=sys.stderr)  # fmt: skip
        return 2
    if args.fresh and args.role == "rollout":
        print("pqrl train: --fresh is the trainer's; a rollout worker joins a run", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the progress
    ctx = _trainer_ranks()
    if ctx.distributed and args.role == "rollout":
        print("pqrl train: --role rollout runs one process; do not start it with torchrun", file=sys.stderr)
        return 2
    from trainer.distributed import exit_rank, shutdown

    try:
        code = _rank(cfg, args, ctx)
    finally:
        shutdown(ctx)
    if ctx.distributed:
        exit_rank(code)
    return code


def _rank(cfg: TrainConfig, args: argparse.Namespace, ctx: Any) -> int:
    """This process's part of the job: the whole of it in a world of one."""
    from trainer.distributed import barrier

    if not ctx.is_main:
        barrier(ctx)  # rank 0 has prepared the run directory
        return _follow(cfg, ctx)
    if args.fresh:
        shutil.rmtree(cfg.run_dir, ignore_errors=True)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    from launcher.manifest import public_config

    dump = yaml.safe_dump(public_config(cfg), sort_keys=False)
    (cfg.run_dir / "config.yaml").write_text(dump)
    barrier(ctx)
    from launcher.services import job_services

    try:
        with job_services(cfg, quiet=args.quiet) as services:
            how = {"role": args.role, "quiet": args.quiet, "ctx": ctx, "fresh": args.fresh,
                   "started": args.started}  # fmt: skip
            try:
                summary = asyncio.run(_run_job(cfg, services, **how))
            finally:
                # the job is over: a late second Ctrl-C must not cut short stopping its services
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                if services.get("children") is not None:
                    services["children"].disarm()
    except PqrlError as e:  # before training began (a preflight) or on a rollout worker
        summary = {"run": cfg.run, "updates": 0, "ended": e.line(), "exit_code": e.exit_code}
    print(json.dumps(summary))
    code = int(summary.get("exit_code", 0))
    if code:  # short of its step budget: say why on the last line
        print(f"pqrl train: {summary['ended']}", file=sys.stderr)
    return code


async def _run_job(cfg: TrainConfig, services: dict[str, Any], **how: Any) -> dict[str, Any]:
    """The job, beside a watch on the processes it started: one that dies ends it (see
    ``launcher.children``): what was trained is checkpointed, nothing else is waited for."""
    from launcher.rollout_side import Job
    from launcher.trainer_side import train

    job = Job(cfg, services, **how)
    if job.role != "rollout" and not job.ctx.distributed:
        # the trainer loads while the job waits for its engine, once the store has answered: a job
        # that cannot reach Redis says so at once, without loading a model first
        from launcher.trainer_build import build_trainer

        def start_building() -> asyncio.Future[Any]:
            building = asyncio.ensure_future(asyncio.to_thread(build_trainer, cfg, job.ctx))
            building.add_done_callback(lambda f: f.cancelled() or f.exception())  # raised where awaited
            return building

        job.on_store = start_building

    async def work() -> dict[str, Any]:
        async with job:
            return await job.rollout_only() if job.role == "rollout" else await train(job, job.prepared)

    task = asyncio.ensure_future(work())
    children = services.get("children")
    if children is None:
        return await task
    death = asyncio.ensure_future(children.wait_for_death())
    await asyncio.wait({task, death}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        death.cancel()
        failed = not task.cancelled() and task.exception() is not None
        if failed and (died := children.death()) is not None:  # the cause, not its symptom
            raise died from task.exception()
        return task.result()
    died = death.result()
    children.exit_unless_done_in(15, str(died.code), died.status)
    job.stopping.set()
    job.hurry.set()  # nothing in flight can finish without the dead process
    task.cancel()
    await asyncio.wait({task}, timeout=10)
    raise died


def _trainer_ranks() -> Any:
    """Under torchrun, this process's place among the trainer ranks (FSDP2); else a world of one."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        from trainer.distributed import DistContext

        return DistContext()
    from trainer.distributed import init_from_env

    return init_from_env()


def _follow(cfg: TrainConfig, ctx: Any) -> int:
    """A rank other than 0: train its share of every step rank 0 announces, until told to stop."""
    from launcher.trainer_build import build_trainer
    from trainer.ranks import follow

    # rank 0 leads the shutdown too (it finishes the step and checkpoints first); a follower stopped
    # by torchrun's SIGTERM would break that step's collectives. If rank 0 dies, they fail at once.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    parts = build_trainer(cfg, ctx)
    steps = follow(parts.model, parts.optimizer, parts.step_cfg, ctx, scheduler=parts.scheduler,
                   ref_model=parts.ref_model)  # fmt: skip
    log.info("rank %d: %d steps trained", ctx.rank, steps)
    return 0
