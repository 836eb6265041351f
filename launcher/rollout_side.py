"""One training job in this process: its clients (store, engine, environments), its task plan and its
rollout side; ``launcher.trainer_side`` runs the trainer side with it.

``role`` says what runs here: ``all`` (rollouts and trainer, the embedded default), ``trainer`` or
``rollout`` (distributed mode: rollout workers and trainers on different machines, one Redis).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from launcher.jobconfig import TrainConfig, episode_config, manager_config, shared_settings

__all__ = ["Job"]

log = logging.getLogger("pqrl.rollout")


class Job:
    def __init__(
        self,
        cfg: TrainConfig,
        services: dict[str, Any],
        *,
        role: str,
        quiet: bool,
        ctx: Any = None,
        fresh: bool = False,
        started: float | None = None,
    ) -> None:
        from trainer.distributed import DistContext

        self.cfg, self.services, self.role, self.quiet, self.fresh = cfg, services, role, quiet, fresh
        self.started = time.monotonic() if started is None else started  # the command's start
        self.on_store: Callable[[], Any] | None = None  # called once the store answers
        self.prepared: Any = None  # what it returned
        self.ctx = ctx or DistContext()
        self.stopping = asyncio.Event()  # first Ctrl-C: finish the step, checkpoint, stop
        self.hurry = asyncio.Event()  # second: give up the step in progress too (see _on_signal)
        self.manager: Any = None
        self.evals: dict[str, Any] = {}
        self.store: Any = None
        self.engine: Any = None
        self.env: Any = None
        self.suites: list[Any] = []

    async def __aenter__(self) -> Job:
        """Connects the run's store, engine and environments and loads its suites."""
        from env_server.client import HttpEnvClient, LocalEnvClient
        from pqrl.store import TrajectoryStore

        cfg = self.cfg
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        self.store = TrajectoryStore(self.services["redis_url"], cfg.run)
        servers = self.services["env_servers"]
        self.env = HttpEnvClient(servers, token=self.services["env_token"]) if servers else LocalEnvClient()
        try:
            await self.store.ping()
            await self._agree_on_settings()
            if self.on_store is not None:
                self.prepared = self.on_store()
            if self.services["engines"]:
                await self._connect_engines()
            self.suites = [r.build() for r in cfg.tasks.suites]
            await self._check_env_servers()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _connect_engines(self, timeout_s: float = 300) -> None:
        """The client of the engines once every one answers, each checked to be of the kind
        ``services.engine`` names; at once ends the job when one this job started has died."""
        from launcher.children import Children
        from launcher.engine_choice import connect_engines

        children = self.services.get("children") or Children(quiet=self.quiet)
        urls, backend = self.services["engines"], self.cfg.services.engine
        self.engine = await connect_engines(
            urls, backend, children, timeout_s=timeout_s, stop=self.stopping, named_by="services.engine:"
        )

    async def _check_env_servers(self) -> None:
        """Ready, taking the token, knowing the suites' environments: else a permanent fault now."""
        from launcher.preflight import check_env_servers

        env_ids = {s.manifest.env_id for s in self.suites}
        await check_env_servers(self.env, env_ids, grace_s=self.cfg.rollout.backend_grace_s,
                                children=self.services.get("children"))  # fmt: skip

    def _on_signal(self) -> None:
        """Ctrl-C (or SIGTERM) once: the step in progress finishes and is checkpointed, then the job
        stops; a step still waiting for groups gives way at once (nothing of it is trained or
        acknowledged; its groups are read again on resume). Twice: the step gives way too (before its
        first weight update; its groups come back on resume), evaluations and rollouts in flight are
        dropped, and what was trained is saved."""
        if not self.stopping.is_set():
            self.stopping.set()
            log.warning("stopping after this step (it will be checkpointed; a step still waiting for groups "
                        "stops now); Ctrl-C again to stop at once")  # fmt: skip
        elif not self.hurry.is_set():
            self.hurry.set()
            log.warning("stopping at once: checkpointing what was trained")

    async def __aexit__(self, *exc: object) -> None:
        if self.engine is not None:
            await self.engine.aclose()
        await self.env.aclose()
        await self.store.close()

    async def _agree_on_settings(self) -> None:
        """Joins the run only with the settings its other processes use (a fresh trainer sets them; an
        embedded job is the run's only process, so a resumed one may change them)."""
        replace = (self.fresh or self.cfg.embedded) and self.role != "rollout"
        diff = await self.store.pins.agree(shared_settings(self.cfg), replace=replace)
        if diff:
            lines = "\n".join(f"  {k}: the run's {a!r}, this config's {b!r}" for k, (a, b) in diff.items())
            raise SystemExit(
                f"pqrl train: run {self.cfg.run!r} already runs with other settings (set by the first of its "
                f"processes to start):\n{lines}\nstart this process from the run's config, or start the "
                "trainer with --fresh to give the run these settings"
            )

    async def _stop_when_the_trainer_finishes(self, manager: Any, every_s: float = 2.0) -> None:
        """Stops ``manager`` once the run's trainer reports it finished: after that the gate stays shut
        and the worker would wait forever. A finish reported before this worker started belongs to an
        earlier attempt of the run unless a trainer is seen at work meanwhile."""
        from pqrl.store import StoreUnavailable

        started, seen_working = time.time(), False
        while True:
            with contextlib.suppress(StoreUnavailable):  # a restarting Redis: look again later
                status = await self.store.status.get()
                if status.get("phase") == "finished" and (
                    seen_working or status.get("finished_at", 0) > started
                ):
                    # a warning, so a --quiet worker still says why it ends
                    log.warning("the trainer finished the run: stopping after the groups in flight")
                    self.ended = "the trainer finished the run"
                    manager.stop()
                    return
                seen_working |= status.get("phase") not in (None, "finished")
            await asyncio.sleep(every_s)

    def renderer(self) -> Any:
        from launcher.model_io import renderer_of

        return renderer_of(self.cfg.model)

    def start_manager(self) -> Any:
        from agent_loop.manager import RolloutManager

        cfg = manager_config(self.cfg)
        self.manager = RolloutManager(self.store, self.engine, self.env, self.renderer(), cfg)
        return self.manager

    async def evaluate(self, suite: Any, progress: Any = None) -> Any:
        """Greedy pass@1 and pass@k on ``suite`` (an ``agent_loop.evaluation.Evaluation``);
        ``progress(done, total)`` after each episode."""
        from agent_loop.evaluation import evaluate

        cfg, e = episode_config(self.cfg), self.cfg.eval
        return await evaluate(suite, engine=self.engine, env=self.env, cfg=cfg, k=e.k,
                              renderer=self.renderer(), max_failed_infra=e.max_failed_infra,
                              progress=progress)  # fmt: skip

    async def queue_tasks(self) -> None:
        """Gives the run its task sampler (suites mixed by weight, shuffled per epoch; idempotent).

        Without ``tasks.epochs`` the schedule covers the step budget: each step may read
        ``groups_per_step`` groups ``1 + train.max_extra_reads`` times (groups without signal), one
        more for groups the rollout side drops, and ``1 + tasks.skip_flat`` times that when tasks
        without signal give up their draws.
        """
        from pqrl.store import StoreError
        from tasks.storage import SuiteStore, WeightedSuite

        refs, suites = self.cfg.tasks.suites, self.suites
        weighted = [WeightedSuite(s, ref.weight) for s, ref in zip(suites, refs, strict=True)]
        t = self.cfg.tasks
        tr = self.cfg.train
        groups = tr.steps * tr.groups_per_step * (2 + tr.max_extra_reads) * (1 + t.skip_flat)
        epochs = t.epochs or max(1, -(-groups // max(sum(len(s.tasks) for s in suites), 1)))
        suite_store = SuiteStore(self.services["redis_url"])
        try:
            await suite_store.configure_sampler(
                self.cfg.run, weighted, epochs=epochs, seed=t.seed, skip_flat=t.skip_flat,
                grow_epochs=t.epochs is None,  # a larger step budget on resume extends the plan
            )  # fmt: skip
        except StoreError as e:
            raise SystemExit(
                f"pqrl train: {e} (the config's tasks changed: start over with --fresh)"
            ) from None
        finally:
            await suite_store.aclose()

    async def rollout_only(self) -> dict[str, Any]:
        """Role ``rollout``: run groups until the run's task plan is done or its trainer finishes."""
        await self.queue_tasks()
        manager = self.start_manager()
        self.ended = "the task queue is empty"

        def on_signal() -> None:
            self.ended = "stopped by a signal"
            manager.stop()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_signal)
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, on_signal)
        watch = asyncio.create_task(self._stop_when_the_trainer_finishes(manager))
        try:
            stats = await manager.run(until_empty=True)
        finally:
            watch.cancel()
        return {
            "ended": self.ended,
            "groups_written": stats.groups_written,
            "groups_dropped": stats.groups_dropped,
            "failures": dict(stats.failures),
            "dead_tasks": dict(stats.dead_tasks),
        }
