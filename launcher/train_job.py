"""``pqrl train CONFIG``: one command for a whole training job, and ``pqrl status``.

Like the CLI module, this is the one place allowed to start every part (DESIGN.md section 1).

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
import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from launcher.jobconfig import ConfigInvalid, SuiteRef, TrainConfig, explain, load_config

__all__ = ["add_status_arguments", "add_train_arguments", "status_command", "train_command"]

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
    p.add_argument("--fresh", action="store_true", help="delete the run directory and start over")
    p.add_argument("--explain", action="store_true", help="list every config field and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True)
    p.add_argument("--redis-url", default=None, help="default: $REDIS_URL, else the embedded job's own")
    p.add_argument("--output-dir", default="runs", help="where an embedded job keeps its run directory")


def _overrides(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigInvalid(f"--set {pair!r}: expected FIELD=VALUE")
        out[key] = yaml.safe_load(value)
    return out


def train_command(args: argparse.Namespace) -> int:
    if args.explain:
        print("\n".join(explain()))
        return 0
    if not args.config:
        print("pqrl train: give a CONFIG file (pqrl train --explain lists its fields)", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, _overrides(args.set))
    except ConfigInvalid as e:
        print(f"pqrl train: {e}", file=sys.stderr)
        return 2
    if cfg.embedded and args.role != "all":
        print("pqrl train: --role needs services.redis_url (distributed mode)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the progress
    ctx = _trainer_ranks()
    if ctx.distributed and args.role == "rollout":
        print("pqrl train: --role rollout runs one process; do not start it with torchrun", file=sys.stderr)
        return 2
    from trainer.distributed import barrier, shutdown

    try:
        if not ctx.is_main:
            barrier(ctx)  # rank 0 has prepared the run directory
            return _follow(cfg, ctx)
        if args.fresh:
            shutil.rmtree(cfg.run_dir, ignore_errors=True)
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        dump = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
        (cfg.run_dir / "config.yaml").write_text(dump)
        barrier(ctx)
        with _services(cfg) as services:
            summary = asyncio.run(_Job(cfg, services, role=args.role, quiet=args.quiet, ctx=ctx).run())
    finally:
        shutdown(ctx)
    print(json.dumps(summary))
    return 0


def _trainer_ranks() -> Any:
    """Under torchrun, this process's place among the trainer ranks (FSDP2); else a world of one."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        from trainer.distributed import DistContext

        return DistContext()
    from trainer.distributed import init_from_env

    return init_from_env()


# -- services -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _services(cfg: TrainConfig) -> Iterator[dict[str, Any]]:
    """Redis and engine URLs: the configured ones, or private ones started (and stopped) here."""
    if not cfg.embedded:
        yield {"redis_url": cfg.services.redis_url, "engines": cfg.services.engines}
        return
    from pqrl.redis_server import RedisServer, free_port

    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(RedisServer(data_dir=cfg.run_dir / "redis", die_with_parent=True))
        engines = list(cfg.services.engines)
        if not engines:
            port = free_port()
            stack.enter_context(_engine_process(cfg, port))
            engines = [f"http://127.0.0.1:{port}"]
        (cfg.run_dir / "services.json").write_text(json.dumps({"redis_url": redis.url, "engines": engines}))
        try:
            yield {"redis_url": redis.url, "engines": engines}
        finally:
            (cfg.run_dir / "services.json").unlink(missing_ok=True)


@contextlib.contextmanager
def _engine_process(cfg: TrainConfig, port: int) -> Iterator[subprocess.Popen[bytes]]:
    from pqrl.redis_server import die_with_parent

    threads = str(cfg.services.engine_threads)
    env = os.environ | {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "engine",
        "serve",
        "--backend",
        "builtin",
        "--model",
        cfg.model.name,
        "--port",
        str(port),
        "--seed",
        str(cfg.seed),
    ]
    with open(cfg.run_dir / "engine.log", "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the job --------------------------------------------------------------------------------------


def _load_suite(ref: SuiteRef) -> Any:
    if ref.generate == "search":
        from tasks.search import search_suite

        return search_suite(ref.n, ref.seed, name=f"search-s{ref.seed}")
    if ref.generate == "coding":
        from importlib.resources import files

        from tasks.suite import load_suite

        return load_suite(str(files("tasks.coding") / "suite.jsonl"))
    if ref.generate == "calc":
        from tasks.calc import calc_suite

        return calc_suite(ref.n, ref.seed, name=f"calc{ref.level}-s{ref.seed}", shots=ref.shots,
                          level=ref.level, format_reward=ref.format_reward)  # fmt: skip
    from tasks.suite import load_suite

    return load_suite(ref.path)  # type: ignore[arg-type]


class _Job:
    def __init__(
        self, cfg: TrainConfig, services: dict[str, Any], *, role: str, quiet: bool, ctx: Any = None
    ) -> None:
        from trainer.distributed import DistContext

        self.cfg, self.services, self.role, self.quiet = cfg, services, role, quiet
        self.ctx = ctx or DistContext()
        self.stopping = asyncio.Event()
        self.manager: Any = None

    async def run(self) -> dict[str, Any]:
        from engine.client import EngineClient
        from env_server.client import HttpEnvClient, LocalEnvClient
        from pqrl.store import TrajectoryStore

        cfg = self.cfg
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # finish the step, checkpoint, stop
            loop.add_signal_handler(sig, self.stopping.set)
        store = TrajectoryStore(self.services["redis_url"], cfg.run)
        engine = EngineClient(self.services["engines"]) if self.services["engines"] else None
        env = (
            HttpEnvClient(
                cfg.services.env_servers, token=cfg.services.env_token or os.environ.get("PQRL_ENV_TOKEN")
            )
            if cfg.services.env_servers
            else LocalEnvClient()
        )
        try:
            await store.ping()
            if engine is not None:
                await engine.wait_until_healthy(timeout_s=300)
            suites = [_load_suite(r) for r in cfg.tasks.suites]
            if self.role == "rollout":
                return await self._rollout_only(store, engine, env, suites)
            return await self._train(store, engine, env, suites)
        finally:
            if engine is not None:
                await engine.aclose()
            await env.aclose()
            await store.close()

    # ---------------------------------------------------------------- rollout side

    def _episode_config(self) -> Any:
        from agent_loop.agent import EpisodeConfig

        r = self.cfg.rollout
        return EpisodeConfig(max_turns=r.max_turns, max_new_tokens=r.max_new_tokens,
                             max_total_tokens=r.max_total_tokens, temperature=r.temperature)  # fmt: skip

    def _manager(self, store: Any, engine: Any, env: Any) -> Any:
        from agent_loop.manager import ManagerConfig, RolloutManager
        from loss_masking import ChatRenderer
        from pqrl.model_cache import load_tokenizer

        r = self.cfg.rollout
        episode = self._episode_config()
        mcfg = ManagerConfig(
            group_size=r.group_size,
            groups_per_step=self.cfg.train.groups_per_step,
            max_staleness=r.max_staleness,
            max_concurrent_groups=r.max_concurrent_groups,
            infra_retries=r.infra_retries,
            episode_deadline_s=r.episode_deadline_s,
            episode=episode,
            progress_every_s=60.0,
        )
        renderer = ChatRenderer(load_tokenizer(self.cfg.model.name))
        return RolloutManager(store, engine, env, renderer, mcfg)

    async def _queue_tasks(self, store: Any, suites: list[Any]) -> None:
        """Gives the run its task sampler (suites mixed by weight, shuffled per epoch; idempotent).

        Without ``tasks.epochs`` the schedule covers the step budget twice over (dropped groups).
        """
        from pqrl.store import StoreError
        from tasks.storage import SuiteStore, WeightedSuite

        weighted = [
            WeightedSuite(s, ref.weight) for s, ref in zip(suites, self.cfg.tasks.suites, strict=True)
        ]
        epochs = self.cfg.tasks.epochs or self._epochs_needed(suites)
        suite_store = SuiteStore(self.services["redis_url"])
        try:
            await suite_store.configure_sampler(
                self.cfg.run, weighted, epochs=epochs, seed=self.cfg.tasks.seed
            )
        except StoreError as e:
            raise SystemExit(
                f"pqrl train: {e} (the config's tasks changed: start over with --fresh)"
            ) from None
        finally:
            await suite_store.aclose()

    def _epochs_needed(self, suites: list[Any]) -> int:
        groups = self.cfg.train.steps * self.cfg.train.groups_per_step * 2
        return max(1, -(-groups // max(sum(len(s.tasks) for s in suites), 1)))

    async def _rollout_only(self, store: Any, engine: Any, env: Any, suites: list[Any]) -> dict[str, Any]:
        await self._queue_tasks(store, suites)
        self.manager = self._manager(store, engine, env)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.manager.stop)
        stats = await self.manager.run(until_empty=True)
        return {
            "groups_written": stats.groups_written,
            "groups_dropped": stats.groups_dropped,
            "failures": dict(stats.failures),
        }

    # ---------------------------------------------------------------- trainer side

    async def _train(self, store: Any, engine: Any, env: Any, suites: list[Any]) -> dict[str, Any]:
        from trainer.loop import LoopConfig, TrainerLoop
        from trainer.ranks import Leader

        cfg, t = self.cfg, self.cfg.train
        parts = _trainer_parts(cfg, self.ctx)
        if parts.latest is not None:
            log.info("loaded checkpoint %s", parts.latest)
        ckpt_dir = cfg.run_dir / "checkpoints"
        loop_cfg = LoopConfig(
            groups_per_step=t.groups_per_step, weights_dir=str(cfg.run_dir / "weights"),
            ckpt_dir=str(ckpt_dir), keep_checkpoints=cfg.checkpoint.keep, max_extra_reads=t.max_extra_reads,
            step=parts.step_cfg,
        )  # fmt: skip
        leader = Leader(self.ctx) if self.ctx.distributed else None
        if leader is not None:
            log.info("training on %d FSDP2 ranks (%s)", self.ctx.world_size, self.ctx.device.type)
        sync = await self._weight_sync(engine, parts.model)
        trainer = TrainerLoop(
            parts.model, parts.optimizer, store, engine, loop_cfg, tokenizer=parts.tokenizer,
            scheduler=parts.scheduler, state=parts.state, ref_model=parts.ref_model, leader=leader, sync=sync,
        )  # fmt: skip
        try:
            return await self._train_loop(store, engine, env, suites, trainer, parts.latest, leader)
        finally:
            if sync is not None:
                await sync.close()

    async def _weight_sync(self, engine: Any, model: Any) -> Any:
        """The configured distributed weight sync, its group formed with every engine; None: disk."""
        from pqrl.redis_server import free_port
        from trainer.weight_sync import DistributedWeightSync

        ws = self.cfg.services.weight_sync
        if ws.method == "disk":
            return None
        if engine is None:
            raise SystemExit("pqrl train: services.weight_sync.method 'distributed' needs engines")
        on_gpu = next(model.parameters()).device.type == "cuda"
        sync = DistributedWeightSync(engine, master_address=ws.address, master_port=ws.port or free_port(),
                                     backend=ws.backend or ("nccl" if on_gpu else "gloo"))  # fmt: skip
        await sync.init()
        log.info("weights go to the engines over %s (%s)", sync.backend, sync.location(0).rsplit("@", 1)[0])
        return sync

    async def _train_loop(
        self, store: Any, engine: Any, env: Any, suites: list[Any], trainer: Any, latest: Any, leader: Any
    ) -> dict[str, Any]:
        from trainer.metrics import MetricsWriter, plot_curves

        cfg, t = self.cfg, self.cfg.train
        writer = MetricsWriter(cfg.run_dir, tensorboard=cfg.tensorboard)
        if latest is not None:
            version = await trainer.resume()
            log.info(
                "resumed from %s at step %d, serving it as policy v%d", latest, trainer.state.step, version
            )
        else:
            await store.gate_reset(groups_per_step=t.groups_per_step)
        eval_suite = _load_suite(cfg.eval.suite) if cfg.eval.suite else None
        evals: dict[str, Any] = {}
        if eval_suite is not None and trainer.state.step == 0:
            evals["before"] = await self._evaluate(eval_suite, engine, env, writer, 0)
        rollout_task = None
        await self._queue_tasks(store, suites)  # the trainer owns the run's task plan (idempotent)
        saved = trainer.state.sampler_position
        if saved is not None and saved > await store.sampler_position():  # a Redis that lost its state
            await store.set_sampler_position(saved)
        if self.role == "all":
            if cfg.embedded:
                await _requeue_abandoned_leases(store)
            self.manager = self._manager(store, engine, env)
            rollout_task = asyncio.create_task(self.manager.run(until_empty=False))
        started = time.monotonic()
        deadline = started + t.max_time_min * 60 if t.max_time_min else None
        bar = _progress(t.steps, trainer.state.step, disable=self.quiet)
        rewards: list[float] = []
        last: dict[str, float] = {}
        try:
            while trainer.state.step < t.steps and not self.stopping.is_set():
                step_task = asyncio.create_task(trainer.step(timeout_s=t.read_timeout_s))
                await _first(step_task, rollout_task)
                last = step_task.result()
                last.setdefault("perf/tokens_per_s", 0.0)  # the step's own figure when it trained
                step = trainer.state.step
                writer.log(step, last)
                if "rollout/reward_mean" in last:
                    rewards.append(last["rollout/reward_mean"])
                timeout = deadline is not None and time.monotonic() > deadline
                if step % cfg.checkpoint.every == 0 or step == t.steps or timeout or self.stopping.is_set():
                    await trainer.checkpoint(sampler_position=await store.sampler_position())
                await self._status(store, trainer, last, rewards)
                bar.update(1)
                bar.set_postfix(
                    v=int(last["policy/version"]),
                    reward=f"{last.get('rollout/reward_mean', 0):.2f}",
                    used=int(last.get("rollout/trajectories_used", 0)),
                )
                if (
                    eval_suite is not None
                    and cfg.eval.every
                    and step % cfg.eval.every == 0
                    and step < t.steps
                ):
                    await self._evaluate(eval_suite, engine, env, writer, step)
                if timeout:
                    log.info("time budget of %.1f min reached at step %d", t.max_time_min, step)
                    break
        finally:
            bar.close()
            # stopped mid-interval (error or signal): keep nothing unsaved. Not with other ranks: after
            # an error they may sit in another collective; the last checkpoint covers what was acked.
            if trainer.state.unacked_entries and leader is None:
                with contextlib.suppress(Exception):
                    await trainer.checkpoint(sampler_position=await store.sampler_position())
            if self.manager is not None:
                self.manager.stop()
            if rollout_task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(rollout_task, timeout=120)
        if leader is not None:
            await asyncio.to_thread(leader.stop)  # the other ranks' work is done
        if eval_suite is not None:
            evals["after"] = await self._evaluate(eval_suite, engine, env, writer, trainer.state.step)
        writer.close()
        png = plot_curves(writer.path, cfg.run_dir / "curves.png")
        await store.set_status({"phase": "finished"})
        summary: dict[str, Any] = {
            "run": cfg.run,
            "steps": trainer.state.step,
            "policy_version": trainer.state.policy_version,
            "minutes": round((time.monotonic() - started) / 60, 2),
            "metrics": str(writer.path),
            "plot": str(png),
        }
        summary |= {f"eval_{k}": v[0] for k, v in evals.items()}
        self.evals = evals
        return summary

    async def _evaluate(self, suite: Any, engine: Any, env: Any, writer: Any, step: int) -> Any:
        from agent_loop.evaluation import evaluate
        from loss_masking import ChatRenderer
        from pqrl.model_cache import load_tokenizer

        episode = self._episode_config()
        t0 = time.monotonic()
        metrics, solved = await evaluate(
            suite,
            engine=engine,
            env=env,
            cfg=episode,
            k=self.cfg.eval.k,
            renderer=ChatRenderer(load_tokenizer(self.cfg.model.name)),
        )
        metrics["perf/eval_s"] = time.monotonic() - t0
        writer.log(step, metrics)
        log.info("eval at step %d: %s", step, {k: round(v, 3) for k, v in metrics.items()})
        return metrics["eval/pass@1"], solved

    async def _status(self, store: Any, trainer: Any, last: dict[str, float], rewards: list[float]) -> None:
        gate = await store.gate_state()
        failures = dict(self.manager.stats.failures) if self.manager is not None else {}
        numbered = (k for k in last if re.fullmatch(r"offpolicy/staleness_\d+", k))
        stale = {k.rsplit("_", 1)[1]: last[k] for k in numbered}
        await store.set_status(
            {
                "phase": "training",
                "step": trainer.state.step,
                "steps": self.cfg.train.steps,
                "policy_version": trainer.state.policy_version,
                "reward_trend": [round(x, 3) for x in rewards[-20:]],
                "staleness": stale,
                "gate": gate,
                "failures": failures,
                "updated": time.time(),
                "mismatch_kl": last.get("offpolicy/mismatch_kl"),
            }
        )


def _load_policy(name_or_dir: str, device: Any = "cpu") -> tuple[Any, Any]:
    import torch

    from pqrl.model_cache import load_model, load_tokenizer

    # float32 master weights; bf16 comes from autocast on GPUs
    return load_model(name_or_dir, dtype=torch.float32).to(device), load_tokenizer(name_or_dir)


@dataclasses.dataclass
class _TrainerParts:
    model: Any
    tokenizer: Any
    ref_model: Any
    optimizer: Any
    scheduler: Any
    state: Any  # CheckpointState, or None on a fresh start
    step_cfg: Any
    latest: Path | None


def _trainer_parts(cfg: TrainConfig, ctx: Any) -> _TrainerParts:
    """The model (sharded under torchrun), optimizer, scheduler and step settings, restored from the
    run's latest checkpoint when it has one. Every rank builds the same."""
    import torch

    from trainer.checkpoint import latest_checkpoint, load_checkpoint
    from trainer.distributed import shard
    from trainer.step import StepConfig

    t = cfg.train
    if cfg.embedded:
        torch.set_num_threads(cfg.services.trainer_threads)
    torch.manual_seed(cfg.seed)
    latest = latest_checkpoint(cfg.run_dir / "checkpoints")
    device = ctx.device if ctx.distributed else ("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = _load_policy(str(latest / "model") if latest else cfg.model.name, device)
    model = shard(model, ctx)
    ref_model = _load_policy(cfg.model.name, device)[0].eval().requires_grad_(False) if t.kl_coef else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / (t.warmup_steps + 1))
    )
    state = load_checkpoint(latest, optimizer=optimizer, scheduler=scheduler, model=model) if latest else None
    step_cfg = StepConfig(
        eps_low=t.eps_low, eps_high=t.eps_high, is_cap=t.is_cap, temperature=cfg.rollout.temperature,
        max_staleness=cfg.rollout.max_staleness, max_grad_norm=t.max_grad_norm,
        micro_batch_tokens=t.micro_batch_tokens, ppo_epochs=t.ppo_epochs, minibatches=t.minibatches,
        kl_coef=t.kl_coef, kl_estimator=t.kl_estimator, compile=t.compile, seed=cfg.seed,
        dtype="float32" if cfg.model.dtype == "float32" else "bfloat16",
        gradient_checkpointing=cfg.model.gradient_checkpointing,
    )  # fmt: skip
    return _TrainerParts(model, tokenizer, ref_model, optimizer, scheduler, state, step_cfg, latest)


def _follow(cfg: TrainConfig, ctx: Any) -> int:
    """A rank other than 0: train its share of every step rank 0 announces, until told to stop."""
    from trainer.ranks import follow

    # rank 0 leads the shutdown too (it finishes the step and checkpoints first); a follower stopped
    # by torchrun's SIGTERM would break that step's collectives. If rank 0 dies, they fail at once.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    parts = _trainer_parts(cfg, ctx)
    steps = follow(parts.model, parts.optimizer, parts.step_cfg, ctx, scheduler=parts.scheduler,
                   ref_model=parts.ref_model)  # fmt: skip
    log.info("rank %d: %d steps trained", ctx.rank, steps)
    return 0


async def _first(step_task: asyncio.Task[Any], rollout_task: asyncio.Task[Any] | None) -> None:
    """Waits for the step; a rollout manager that dies meanwhile is an error, not a silent stall."""
    waiting = {step_task} | ({rollout_task} if rollout_task is not None else set())
    done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if step_task not in done:
        step_task.cancel()
        exc = rollout_task.exception() if rollout_task is not None else None
        raise RuntimeError(f"the rollout manager stopped: {exc!r}")


async def _requeue_abandoned_leases(store: Any) -> None:
    """Embedded resume: the only manager of the run is gone, so its leases go back to the queue."""
    from agent_loop.manager import _GROUP

    await store.requeue_pending_tasks(_GROUP)


def _progress(total: int, initial: int, *, disable: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", disable=disable, file=sys.stderr)


# -- pqrl status ----------------------------------------------------------------------------------


def status_command(args: argparse.Namespace) -> int:
    url = args.redis_url or os.environ.get("REDIS_URL")
    services = Path(args.output_dir) / args.run / "services.json"
    if not url and services.is_file():
        url = json.loads(services.read_text())["redis_url"]
    if not url:
        print(f"pqrl status: give --redis-url (no running embedded job at {services})", file=sys.stderr)
        return 2

    async def read() -> dict[str, Any]:
        from pqrl.store import TrajectoryStore

        async with TrajectoryStore(url, args.run) as store:
            return {
                "status": await store.get_status(),
                "policy": (await store.get_policy()).version,
                "gate": await store.gate_state(),
                "backlog": await store.backlog(),
                "tasks_queued": int(await store.redis.xlen(store.tasks_key)),
            }

    s = asyncio.run(read())
    st = s["status"]
    if not st:
        print(
            f"run {args.run}: no trainer has reported yet "
            f"(policy v{s['policy']}, {s['backlog']} groups stored)"
        )
        return 1
    age = time.time() - st.get("updated", time.time())
    print(
        f"run {args.run}: {st.get('phase')} step {st.get('step')}/{st.get('steps')}, "
        f"policy v{s['policy']} (updated {age:.0f}s ago)"
    )
    print(f"  groups: {s['backlog']} stored, gate {s['gate']}, {s['tasks_queued']} task entries queued")
    print(f"  staleness of last step: {st.get('staleness')}, engine mismatch k1 {st.get('mismatch_kl')}")
    print(f"  reward trend (last {len(st.get('reward_trend', []))} steps): {st.get('reward_trend')}")
    print(f"  rollout failures by kind: {st.get('failures') or 'none'}")
    return 0
