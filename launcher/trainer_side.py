"""The trainer side of a job: resume or start the run, evaluate before, run the rollout manager beside
the trainer (role ``all``), step until the budget, a signal or the time limit, checkpoint on the way,
evaluate after, and report figures to Redis for ``pqrl status``."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import re
import shutil
import sys
import time
from collections.abc import Awaitable
from typing import Any

from launcher.jobconfig import loop_config
from launcher.ram_weights import model_bytes, ram_weights_dir
from launcher.rollout_side import Job
from launcher.trainer_build import TrainerParts, build_trainer
from pqrl.errors import PqrlError
from pqrl.redis_server import free_port

__all__ = ["train"]

log = logging.getLogger("pqrl.train")

# the job's phases, in order ("steps" includes "checkpoints in steps"): the summary's ``phase_s``
PHASES = ("start-up", "eval before", "steps", "checkpoints in steps", "wind-down", "eval after",
          "last checkpoint")  # fmt: skip


async def train(job: Job, building: Awaitable[TrainerParts] | None = None) -> dict[str, Any]:
    """Role ``all`` or ``trainer``: the whole run on this side, to its summary; ``building``: the
    trainer's parts, when they are already being built."""
    from trainer.loop import TrainerLoop
    from trainer.ranks import Leader

    parts = await building if building is not None else build_trainer(job.cfg, job.ctx)
    if parts.latest is not None:
        log.info("loaded checkpoint %s", parts.latest)
    leader = Leader(job.ctx) if job.ctx.distributed else None
    if leader is not None:
        log.info("training on %d FSDP2 ranks (%s)", job.ctx.world_size, job.ctx.device.type)
    sync = await _weight_sync(job, job.engine, parts.model)
    loop = loop_config(job.cfg)
    ram = None
    if job.cfg.embedded and sync is None and leader is None:  # the engine reads this machine's files
        ram = ram_weights_dir(job.cfg.run_dir, model_bytes(parts.model), loop.keep_weights)
    if ram is not None:
        shutil.rmtree(ram, ignore_errors=True)  # a crashed earlier process's
        loop = dataclasses.replace(loop, weights_dir=str(ram))
        log.info("published weights go to %s (RAM; removed when the job ends)", ram)
    if loop.publish_merged:
        log.info("weight syncs carry whole weights, the adapter merged (model.lora.publish)")
    trainer = TrainerLoop(
        parts.model, parts.optimizer, job.store, job.engine, loop, tokenizer=parts.tokenizer,
        scheduler=parts.scheduler, state=parts.state, ref_model=parts.ref_model, critic=parts.critic,
        leader=leader, sync=sync,
    )  # fmt: skip
    run = _Run(job, trainer, leader)
    try:
        return await run.run(resumed=parts.latest is not None)
    finally:
        with contextlib.suppress(Exception):  # failed before waiting for it: what was trained is kept
            await run.last_checkpoint()
        if run.trackers is not None:  # closed already unless the run failed; then its service too
            run.trackers.close()
        await asyncio.to_thread(trainer.close)  # the rollout log's last step
        if sync is not None:
            await sync.close()
        if ram is not None:
            shutil.rmtree(ram, ignore_errors=True)


async def _weight_sync(job: Job, engine: Any, model: Any) -> Any:
    """The configured distributed weight sync, its group formed with every engine; None: disk."""
    from trainer.weight_sync import DistributedWeightSync

    ws = job.cfg.services.weight_sync
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


def open_trackers(cfg: Any, manifest: dict[str, Any]) -> Any:
    from trainer.trackers import Trackers

    rollouts = cfg.run_dir / "rollouts" if cfg.train.rollout_log.enabled else None
    return Trackers(cfg.run_dir, cfg.train.report_to, name=cfg.run, config=manifest, rollout_dir=rollouts)


class _Run:
    def __init__(self, job: Job, trainer: Any, leader: Any) -> None:
        from trainer.metrics import MetricsWriter

        self.job, self.cfg, self.store = job, job.cfg, job.store
        self.trainer, self.leader = trainer, leader
        self.writer = MetricsWriter(self.cfg.run_dir, tensorboard=self.cfg.tensorboard)
        self.eval_suite = self.cfg.eval.suite.build() if self.cfg.eval.suite else None
        self.rollout_task: asyncio.Task[Any] | None = None
        self.rewards: list[float] = []
        self.dropped: collections.Counter[str] = collections.Counter()  # by reason, this process
        self.plan_end: str | None = None  # why the job ended before its step budget
        self.fault: PqrlError | None = None  # a permanent fault that ended it
        self.stopped_by: str | None = None  # "time budget" when max_time_min ended it
        self.trackers: Any = None  # opened with the manifest
        self.phases = dict.fromkeys(PHASES, 0.0)  # seconds of the job by phase
        self.checkpointing: asyncio.Task[None] | None = None  # the last step's, beside what follows it

    async def run(self, *, resumed: bool) -> dict[str, Any]:
        from trainer.metrics import plot_curves

        evals = self.job.evals
        await self._write_manifest()
        await self._resume_or_open_gate(resumed=resumed)
        self.phases["start-up"] = time.monotonic() - self.job.started
        first_step = self.trainer.state.step
        if self.eval_suite is not None and first_step == 0:
            # alone on the engine: batched beside the first step's sampled episodes, its greedy ones
            # come out differently (the products vary with the batch); one engine thread does both
            with self._timed("eval before"):
                before = await self._evaluate(0)
            if before is not None:
                evals["before"] = before
        await self._start_rollouts()
        try:
            with self._timed("steps"):
                await self._steps(time.monotonic())
        except PqrlError as e:  # a permanent fault of the rollout side: summarised, then raised
            self.fault = e
            log.error("%s", e.line())
        finally:
            with self._timed("wind-down"):
                await self._wind_down()
        if self.leader is not None:
            await asyncio.to_thread(self.leader.stop)  # the other ranks' work is done
        if self.eval_suite is not None and self.fault is not None:
            log.info("final evaluation skipped: %s", self.fault)
        elif self.eval_suite is not None and self.job.stopping.is_set():
            # stopped by the user: the checkpoint is written; the final evaluation would keep them
            # waiting minutes more, so it runs when the job is resumed and finishes instead
            log.warning("stopped at step %d: final evaluation skipped; run the same command again to "
                     "resume, and it runs when the job finishes", self.trainer.state.step)  # fmt: skip
        elif self.eval_suite is not None:
            with self._timed("eval after"):
                after = await self._evaluate(self.trainer.state.step)
            if after is not None:
                evals["after"] = after
        with self._timed("last checkpoint"):  # what of it the evaluation did not hide
            await self.last_checkpoint()
        self.writer.close()
        self.trackers.close()
        png = plot_curves(self.writer.path, self.cfg.run_dir / "curves.png")
        await self.store.status.set({"phase": "finished", "finished_at": time.time()})
        summary: dict[str, Any] = {
            "run": self.cfg.run,
            "steps": self.trainer.state.step,
            "updates": self.trainer.state.step - first_step,  # optimizer steps taken by this process
            "policy_version": self.trainer.state.policy_version,
            "minutes": round((time.monotonic() - self.job.started) / 60, 2),  # the job's, from its start
            "metrics": str(self.writer.path),
            "plot": str(png),
        }
        summary |= self._ending()
        summary["phase_s"] = {k: round(v, 1) for k, v in self.phases.items()}
        log.info("time by phase: %s", ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items()))
        manager = self.job.manager
        if manager is not None and manager.stats.tasks_dead_lettered:
            summary["dead_tasks"] = manager.stats.tasks_dead_lettered
            summary["dead_task_causes"] = dict(manager.stats.dead_tasks)
        for when, (rate, _, why) in evals.items():  # a refused rate is left out, with the reason
            summary |= {f"eval_{when}": rate} if why is None else {f"eval_{when}_refused": why}
        return summary

    def _ending(self) -> dict[str, Any]:
        """``ended``: why the job ended, in words; ``exit_code``: what the process exits with."""
        if self.fault is not None:
            return {"ended": self.fault.line(), "exit_code": self.fault.exit_code}
        if self.plan_end is not None:
            return {"ended": self.plan_end, "exit_code": 1}
        if self.job.stopping.is_set():
            return {"ended": "stopped by a signal (Ctrl-C or SIGTERM)", "exit_code": 0}
        if self.stopped_by is not None:
            return {"ended": self.stopped_by, "exit_code": 0}
        return {"ended": "done: the step budget is trained", "exit_code": 0}

    async def _write_manifest(self) -> None:
        """``manifest.json`` in the run directory (each checkpoint copies it); its gist for pqrl status."""
        from launcher.manifest import manifest_gist, run_manifest

        manifest = await asyncio.to_thread(run_manifest, self.cfg, self.job.suites, self.eval_suite)
        (self.cfg.run_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        self.trackers = open_trackers(self.cfg, manifest)
        await self.store.status.set({"phase": "starting", "manifest": manifest_gist(manifest)})

    async def _resume_or_open_gate(self, *, resumed: bool) -> None:
        if resumed:
            version = await self.trainer.resume(live_managers=not self.cfg.embedded)
            log.info("resumed at step %d, serving it as policy v%d", self.trainer.state.step, version)
        else:
            gps = self.cfg.train.groups_per_step
            await self.store.gate.reset(groups_per_step=gps, live_managers=not self.cfg.embedded)

    async def _start_rollouts(self) -> None:
        """Gives the run its task plan and, in role ``all``, runs the rollout manager beside us."""
        from agent_loop.manager import TASK_CONSUMER_GROUP

        trainer, store = self.trainer, self.store
        await self.job.queue_tasks()  # the trainer owns the run's task plan (idempotent)
        saved = trainer.state.sampler_position
        if saved is not None and saved > await store.sampler.position():  # a Redis that lost its state
            await store.sampler.set_position(saved)
        if self.job.role == "all":
            if self.cfg.embedded:  # the only manager of the run is gone: its leases go back to the queue
                await store.tasks.requeue_pending(TASK_CONSUMER_GROUP)
            manager = self.job.start_manager()
            self.rollout_task = asyncio.create_task(manager.run(until_empty=False))

    async def _steps(self, started: float) -> None:
        cfg, t, trainer = self.cfg, self.cfg.train, self.trainer
        deadline = started + t.max_time_min * 60 if t.max_time_min else None
        bar = _progress(t.steps, trainer.state.step, disable=self.job.quiet)
        try:
            while trainer.state.step < t.steps and not self.job.stopping.is_set():
                step_task = asyncio.create_task(trainer.step(timeout_s=t.read_timeout_s))
                last = await self._first(step_task)
                if last is None:
                    break
                self.dropped.update({k.split("/", 1)[1]: int(v) for k, v in last.items()
                                     if k.startswith("dropped/")})  # fmt: skip
                last.setdefault("perf/tokens_per_s", 0.0)  # the step's own figure when it trained
                step = trainer.state.step
                self.writer.log(step, last)
                self.trackers.log(step, last)
                if "rollout/reward_mean" in last:
                    self.rewards.append(last["rollout/reward_mean"])
                timeout = deadline is not None and time.monotonic() > deadline
                last_one = step >= t.steps or timeout or self.job.stopping.is_set()
                if last_one and self.leader is None:  # written while the job winds down and evaluates
                    self.checkpointing = asyncio.create_task(self._checkpoint())
                elif last_one or step % cfg.checkpoint.every == 0:
                    with self._timed("checkpoints in steps"):
                        await self._checkpoint()
                await self._report(last)
                bar.update(1)
                reward = last.get("rollout/reward_mean", 0)
                used = int(last.get("rollout/trajectories_used", 0))
                bar.set_postfix(v=int(last["policy/version"]), reward=f"{reward:.2f}", used=used)
                if (
                    self.eval_suite is not None
                    and cfg.eval.every
                    and step % cfg.eval.every == 0
                    and step < t.steps
                ):
                    await self._evaluate(step)
                if timeout:
                    log.info("time budget of %.1f min reached at step %d", t.max_time_min, step)
                    self.stopped_by = f"time budget of {t.max_time_min:g} min reached (train.max_time_min)"
                    break
        finally:
            bar.close()

    async def _first(self, step_task: asyncio.Task[Any]) -> dict[str, float] | None:
        """The step's metrics; None when it gave way before it changed the weights: the user asked
        to stop (at once, or once while it waits for groups), or it waits for groups that can no
        longer come (``launcher.plan_end``: then ``plan_end`` says so, with the counts)."""
        from launcher.plan_end import plan_end_counts, starved
        from trainer.loop import STREAM_CONSUMER_GROUP

        every_s = self.trainer.cfg.read_block_ms / 1000 + 0.5
        watch = asyncio.create_task(starved(self.store, self.trainer, STREAM_CONSUMER_GROUP, every_s))
        try:
            last = await _first(step_task, self.rollout_task, self.job, self.trainer, watch)
        except BaseException:  # e.g. the job cancelled: the step must not run on unwatched
            step_task.cancel()
            raise
        finally:
            watch.cancel()
        if last is not None:
            return last
        step = self.trainer.state.step + 1
        if watch.done() and not watch.cancelled() and not self.job.stopping.is_set():
            counts = await plan_end_counts(self.store, self.trainer, self.dropped, self.job.manager)
            self.plan_end = f"the task plan is used up: no group can come for step {step}; {counts}"
            log.warning("%s", self.plan_end)
            return None  # no group is in flight: the final evaluation runs
        if self.job.hurry.is_set():
            log.info("step %d given up before it changed the weights", step)
        else:
            log.warning("stopped while step %d waited for groups: nothing of it trained or acknowledged",
                        step)  # fmt: skip
        self.job.hurry.set()  # stopping now: groups in flight are dropped (their tasks requeued on resume)
        return None

    async def _checkpoint(self) -> None:
        await self.trainer.checkpoint(sampler_position=await self.store.sampler.position())

    async def last_checkpoint(self) -> None:
        """Waits for the checkpoint of the last step when it is still being written."""
        task, self.checkpointing = self.checkpointing, None
        if task is not None:
            await task

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Any:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.phases[phase] += time.monotonic() - t0

    async def _wind_down(self) -> None:
        # stopped mid-interval (error or signal): keep nothing unsaved. Not with other ranks: after
        # an error they may sit in another collective; the last checkpoint covers what was acked.
        if self.checkpointing is None and self.trainer.state.unacked_entries and self.leader is None:
            with contextlib.suppress(Exception):
                await self._checkpoint()
        manager = self.job.manager
        if manager is not None and self.trainer.state.step >= self.cfg.train.steps:
            # the budget is trained: a group in flight could only serve a longer run, which generates
            # its own from its newer policy (the task goes back to the queue when the run resumes)
            manager.abandon()
        elif manager is not None:
            manager.stop()
        if self.rollout_task is not None:
            # the groups in flight finish (up to 2 minutes), unless the user asked to stop at once:
            # then they are dropped, and their tasks go back to the queue when the run resumes
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_unless_hurried(self.rollout_task, self.job.hurry), timeout=120)
            if not self.rollout_task.done():
                if manager is not None:
                    manager.abandon()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(self.rollout_task), timeout=30)
                self.rollout_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self.rollout_task

    async def _evaluate(self, step: int) -> tuple[float | None, Any, str | None] | None:
        """``(pass@1, per-task outcomes, why pass@1 is None)`` on the held-out suite; None when the
        user stopped it."""
        t0 = time.monotonic()
        bar = _progress(None, 0, disable=self.job.quiet, desc=f"eval@{step}", unit="episode")

        def progress(done: int, total: int) -> None:
            if bar.total != total:  # known from the first report on
                bar.total = total
            bar.update(done - bar.n)

        work = asyncio.ensure_future(self.job.evaluate(self.eval_suite, progress))
        try:
            if not await _unless_hurried(work, self.job.hurry):
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
                log.info("evaluation at step %d stopped", step)
                return None
            result = work.result()
        finally:
            bar.close()
        metrics = result.metrics | {"perf/eval_s": time.monotonic() - t0}
        self.writer.log(step, metrics)
        self.trackers.log(step, metrics)
        log.info("eval at step %d: %s", step, {k: round(v, 3) for k, v in metrics.items()})
        for name, why in result.refused.items():  # a rate over tasks that never ran would mislead
            log.warning("eval at step %d: NO %s reported: %s", step, name.removeprefix("eval/"), why)
        return result.pass_at_1, result.solved, result.refused.get("eval/pass@1")

    async def _report(self, last: dict[str, float]) -> None:
        """The figures ``pqrl status`` shows, kept in Redis."""
        manager = self.job.manager
        numbered = (k for k in last if re.fullmatch(r"offpolicy/staleness_\d+", k))
        await self.store.status.set(
            {
                "phase": "training",
                "step": self.trainer.state.step,
                "steps": self.cfg.train.steps,
                "policy_version": self.trainer.state.policy_version,
                "reward_trend": [round(x, 3) for x in self.rewards[-20:]],
                "staleness": {k.rsplit("_", 1)[1]: last[k] for k in numbered},
                "gate": await self.store.gate.state(),
                "failures": dict(manager.stats.failures) if manager is not None else {},
                "updated": time.time(),
                "mismatch_kl": last.get("offpolicy/mismatch_kl"),
            }
        )


async def _first(
    step_task: asyncio.Task[Any],
    rollout_task: asyncio.Task[Any] | None,
    job: Job,
    trainer: Any,
    starved: asyncio.Task[None],
) -> dict[str, float] | None:
    """The step's metrics; None when it gave way (see ``TrainerLoop.abort``): asked to stop at once,
    or, while it still waits for groups, asked to stop or ``starved`` (cancelling it then loses
    nothing). A rollout manager that dies meanwhile is an error, not a silent stall."""
    from trainer.batch import StepAborted

    while not step_task.done():
        if job.hurry.is_set():
            if not trainer.abort():
                step_task.cancel()  # still reading groups: nothing to undo
            try:
                return await step_task  # past its first update, a step finishes
            except (asyncio.CancelledError, StepAborted):
                return None
        if trainer.waiting and (job.stopping.is_set() or starved.done()):
            step_task.cancel()
            try:
                return await step_task  # it had just finished
            except asyncio.CancelledError:
                return None
        if rollout_task is not None and rollout_task.done():
            step_task.cancel()
            exc = rollout_task.exception()
            if isinstance(exc, PqrlError):  # a permanent fault, already in words
                raise exc
            raise RuntimeError(f"the rollout manager stopped: {exc!r}")
        pending = {t for t in (step_task, rollout_task, starved) if t is not None and not t.done()}
        await asyncio.wait(pending, timeout=0.2, return_when=asyncio.FIRST_COMPLETED)
    return step_task.result()


async def _unless_hurried(task: asyncio.Future[Any], hurry: asyncio.Event, *others: Any) -> bool:
    """Waits for ``task``, ``hurry`` or any of ``others`` (None skipped); whether ``task`` is done."""
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait({task, hurried, *filter(None, others)}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hurried.cancel()
    return task.done()


def _progress(
    total: int | None, initial: int, *, disable: bool, desc: str = "train", unit: str = "step"
) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, file=sys.stderr)
