"""The asynchronous rollout manager: turns a run's queued tasks into stored groups.

Each task is leased from the run's task queue (a Redis consumer group: a manager that dies leaves
its leases pending, and another manager reclaims them after ``lease_timeout_s``), run as a group
of G episodes, and written to the trajectory stream only when complete. Groups start only while
the staleness gate (counters in Redis shared by every manager of the run, changed atomically)
has room, so no sample lags the policy by more than ``max_staleness`` versions on admission.
Episodes whose infrastructure failed are retried up to ``infra_retries`` times; a group left with
fewer than ``min_valid`` usable episodes (never below ``pqrl.staleness.MIN_GROUP_EPISODES``, under
which the trainer would drop it) is dropped, counted, and frees its place in the gate.
A group that falls too far behind the policy to be trained (``agent_loop.culling``) is cancelled
while it generates, frees its place, and its task is queued again (``stale_requeues`` times).

Failures are classified by ``pqrl.faults``: a permanent job-wide one (a wrong token, an unknown
environment or model, the sandbox backend down past ``backend_grace_s``) stops the manager at once
and ``run`` raises it as ``pqrl.errors.PermanentFault``, the task left unacknowledged (it runs again
when the job does); a permanent one of the task (its reset rejects it, its grader fails its own
gold) moves the task to the run's dead tasks with the cause, and the manager goes on; transient
ones are retried as above. Redis unreachable for longer than ``redis_grace_s`` stops it too, as
``pqrl.errors.RetriesExhausted``. A group that raised anything else is dead-lettered too: no lease is left
pending for ever.

When the run has a task sampler (tasks.storage.RunSampler: epochs, seeded shuffling, per-suite
mixing weights) a manager with nothing in the queue claims the sampler's next slot, atomically
with leasing it, so several managers share one schedule without taking a slot twice. Tasks
submitted to the queue go first. With ``until_empty`` the manager stops once the queue is empty,
the schedule is over and its own groups are done; the progress line reports the sampler position.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from agent_loop.agent import failed_trajectory, run_episode
from agent_loop.config import ManagerConfig
from agent_loop.culling import GroupWatch
from engine.protocol import CatchesUpFromDisk, Engine, EngineError
from env_server.client import EnvClient
from env_server.sessions import EnvServerError
from loss_masking import ChatRenderer
from pqrl.errors import PermanentFault, PqrlError, RetriesExhausted
from pqrl.faults import Fault, fault_of, fix_for
from pqrl.store import StoreUnavailable, TaskEntry, TrajectoryStore
from pqrl.store.gate import HOLDER_TTL_MS
from pqrl.store.tasks import task_json
from pqrl.trajectory import Status, Trajectory
from tasks.storage import RunSampler

__all__ = ["TASK_CONSUMER_GROUP", "ManagerConfig", "RolloutManager"]

log = logging.getLogger(__name__)

TASK_CONSUMER_GROUP = "rollout"  # the Redis consumer group through which managers lease tasks
CULL_EVERY_S = 0.25  # how often groups in flight are checked against the policy version


@dataclass
class _Stats:
    groups_written: int = 0
    groups_dropped: int = 0
    groups_culled: int = 0  # cancelled as too stale to train
    dead_tasks: dict[str, str] = field(default_factory=dict)  # task id -> why (the first few)
    tasks_dead_lettered: int = 0
    episodes: int = 0
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    started: float = field(default_factory=time.monotonic)


class RolloutManager:
    """Runs groups for one run until the task queue is empty (or ``stop`` is called)."""

    def __init__(
        self,
        store: TrajectoryStore,
        engine: Engine,
        env: EnvClient,
        renderer: ChatRenderer,
        cfg: ManagerConfig,
        *,
        consumer: str | None = None,
    ) -> None:
        self.store, self.engine, self.env, self.renderer = store, engine, env, renderer
        self.cfg = cfg
        self.consumer = consumer or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self.stats = _Stats()
        self._stopping = asyncio.Event()
        self._abandoning = False  # abandon(): groups in flight are cancelled, not awaited
        self._in_flight: set[asyncio.Task[None]] = set()
        self._generating: dict[asyncio.Task[None], GroupWatch] = {}  # groups that may still be culled
        self._requeued: collections.Counter[str] = collections.Counter()
        self._sampler: RunSampler | None = None  # loaded when the run has one (it may be set later)
        self._told: set[str] = set()
        self._weights_checked = float("-inf")
        self.fault: PqrlError | None = None  # why this manager stopped for good
        self._down_since: float | None = None  # the sandbox backend's outage, while it lasts

    def stop(self) -> None:
        """Graceful shutdown: no new groups; groups in flight finish and are written."""
        self._stopping.set()

    def abandon(self) -> None:
        """Shutdown now: no new groups, and the groups in flight are cancelled (their tasks stay
        leased and go back to the queue when the run's pending leases are requeued)."""
        self._abandoning = True
        self._stopping.set()
        for task in self._in_flight:
            task.cancel()

    async def run(self, *, until_empty: bool = True) -> _Stats:
        """Produces groups until the queue is drained (``until_empty``) or ``stop()``."""
        last_progress = time.monotonic()
        redis_down: float | None = None  # since when admission has found Redis unreachable
        beating = asyncio.create_task(self._beat())
        culling = asyncio.create_task(self._cull()) if self.cfg.cull_stale else None
        try:
            while not self._stopping.is_set():
                try:
                    if time.monotonic() - last_progress > self.cfg.progress_every_s:
                        await self._progress()
                        last_progress = time.monotonic()
                    outcome = await self._start_one()
                    redis_down = None
                except StoreUnavailable as e:  # a restarting Redis: groups in flight go on, admission waits
                    redis_down = time.monotonic() if redis_down is None else redis_down
                    if time.monotonic() - redis_down > self.cfg.redis_grace_s:
                        self._stop_for(RetriesExhausted(
                            f"Redis unreachable for {self.cfg.redis_grace_s:g}s: {e}",
                            fix="start Redis or check --redis-url / $PQRL_REDIS_URL"))  # fmt: skip
                        break
                    self._tell("Redis unreachable", str(e))
                    await asyncio.sleep(1.0)
                    continue
                if outcome == "drained" and until_empty and not self._in_flight:
                    break
                if outcome != "started":
                    await self._wait_a_little()
        finally:
            if self._in_flight:
                if self._abandoning:
                    for task in self._in_flight:
                        task.cancel()
                await asyncio.gather(*self._in_flight, return_exceptions=True)
            beating.cancel()
            if culling is not None:
                culling.cancel()
            with contextlib.suppress(StoreUnavailable):
                await self._progress()
        if self.fault is not None:
            raise self.fault
        return self.stats

    async def _start_one(self) -> str:
        """Admits and leases one task and starts its group: ``started``; ``full`` (no slot, or the gate
        is shut); ``drained`` (nothing to run)."""
        if len(self._in_flight) >= self.cfg.max_concurrent_groups or not await self.store.gate.admit(
            holder=self.consumer,
            max_concurrent=self.cfg.max_concurrent_groups,
            max_staleness=self.cfg.max_staleness,
            groups_per_step=self.cfg.groups_per_step,
        ):
            return "full"
        try:
            entry = await self._lease()
        except BaseException:
            with contextlib.suppress(StoreUnavailable):
                await self.store.gate.release(holder=self.consumer)
            raise
        if entry is None:
            await self.store.gate.release(holder=self.consumer)  # nothing to run: give the place back
            return "drained"
        watch = GroupWatch(self.engine, self.cfg.group_size)
        task = asyncio.create_task(self._group(entry, watch))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return "started"

    async def _beat(self) -> None:
        """Keeps this manager's gate places while it runs; a killed manager's are given back."""
        while True:
            with contextlib.suppress(StoreUnavailable):  # a restarting Redis: beat again soon
                await self.store.gate.beat(self.consumer)
            await asyncio.sleep(HOLDER_TTL_MS / 1000 / 6)

    async def _cull(self) -> None:
        """Cancels each group that can no longer be trained while it is still generating."""
        while True:
            await asyncio.sleep(CULL_EVERY_S)
            if not self._generating:
                continue
            with contextlib.suppress(StoreUnavailable):  # a restarting Redis: look again soon
                version = (await self.store.policy.get()).version
                for task, watch in list(self._generating.items()):
                    if not watch.culled and watch.hopeless(version, self.cfg.max_staleness):
                        watch.culled = True
                        task.cancel()

    async def _requeue(self, entry: TaskEntry) -> None:
        """A culled group's task runs again, up to ``stale_requeues`` times (a task whose episodes are
        always slow is then given up, as the trainer would drop its groups anyway)."""
        # one draw of a task: the same dict when requeued, another slot or epoch when drawn again
        key = hashlib.blake2b(task_json(entry.task).encode(), digest_size=16).hexdigest()
        if self._requeued[key] < self.cfg.stale_requeues:
            self._requeued[key] += 1
            await self._through_outage(lambda: self.store.tasks.push([entry.task]))
        await self._through_outage(lambda: self.store.tasks.ack(TASK_CONSUMER_GROUP, [entry.entry_id]))

    async def _wait_a_little(self) -> None:
        # Short: a new policy version (which opens the gate) is only seen at the next look.
        if self._in_flight:
            await asyncio.wait(self._in_flight, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 0.1)

    async def _lease(self) -> TaskEntry | None:
        stale = await self.store.tasks.reclaim(
            TASK_CONSUMER_GROUP, self.consumer, min_idle_ms=int(self.cfg.lease_timeout_s * 1000), count=1
        )
        if stale:
            log.info("reclaimed task lease %s from a manager that stopped", stale[0].entry_id)
            return stale[0]
        fresh = await self.store.tasks.take(TASK_CONSUMER_GROUP, self.consumer, count=1)
        if fresh:
            return fresh[0]
        if self._sampler is None:
            self._sampler = await RunSampler.load(self.store)
        return await self._sampler.claim(TASK_CONSUMER_GROUP, self.consumer) if self._sampler else None

    async def _serve_the_current_policy(self) -> None:
        """An engine restarted mid-run comes back with its base weights: before a group starts, load
        the run's current ones on every engine that serves an older version (disk weight sync only:
        a process-group sync reaches a new engine at the trainer's next step). Looked at most every
        few seconds; a failure leaves it for the next look."""
        if not isinstance(self.engine, CatchesUpFromDisk) or time.monotonic() - self._weights_checked < 2.0:
            return
        self._weights_checked = time.monotonic()
        try:
            policy = await self.store.policy.get()
            if policy.version > 0 and policy.weights and "://" not in policy.weights:
                for url in await self.engine.catch_up_from_disk(policy.weights, policy.version):
                    log.warning("engine %s was behind: now serves policy v%d", url, policy.version)
        except (EngineError, StoreUnavailable) as e:
            self._tell("could not bring the engines to the current policy", str(e))

    async def _group(self, entry: TaskEntry, watch: GroupWatch) -> None:
        group_id = uuid.uuid4().hex[:12]
        written = False
        me = asyncio.current_task()
        try:
            await self._serve_the_current_policy()
            if me is not None and self.cfg.cull_stale:
                self._generating[me] = watch
            try:
                results = await _all_or_none(
                    [self._episode(entry.task, group_id, i, tap) for i, tap in enumerate(watch.taps)]
                )
            except asyncio.CancelledError:
                if not watch.culled or self._abandoning or me is None:
                    raise
                me.uncancel()  # this manager's own decision: the group ends here, not the manager
                self.stats.groups_culled += 1
                log.info("group %s for %s cancelled: too stale to be trained", group_id,
                         entry.task.get("task_id"))  # fmt: skip
                await self._requeue(entry)
                return
            finally:
                self._generating.pop(me, None)  # type: ignore[arg-type]
            valid = [t for t in results if t.status is not Status.FAILED_INFRA]
            if len(valid) < self.cfg.min_valid:
                self.stats.groups_dropped += 1
                self.stats.failures["group_too_few_valid"] += 1
                log.warning("group %s for %s dropped: %d valid of %d", group_id, entry.task.get("task_id"),
                            len(valid), len(results))  # fmt: skip
            else:
                await self._through_outage(
                    lambda: self.store.groups.put(results, timeout=self.cfg.put_timeout_s)
                )
                written = True
                self.stats.groups_written += 1
                sampler = self._sampler
                if sampler is not None:  # for its skipping of tasks without signal
                    rewards = [t.reward for t in valid]
                    await self._through_outage(lambda: sampler.record(entry.task, rewards))
            await self._through_outage(lambda: self.store.tasks.ack(TASK_CONSUMER_GROUP, [entry.entry_id]))
        except _JobFault:
            pass  # the lease stays pending: the task runs again when the job does
        except Exception as e:  # the task's own fault, or a bug: never leased again for ever
            with contextlib.suppress(StoreUnavailable):
                await self._dead_letter(entry, e)
        finally:
            with contextlib.suppress(StoreUnavailable):  # gone for good: a restart frees the place
                await self._through_outage(
                    lambda: self.store.gate.finish(holder=self.consumer, accepted=written)
                )

    async def _dead_letter(self, entry: TaskEntry, e: Exception) -> None:
        """Moves ``entry``'s task to the run's dead tasks with the cause (its lease acknowledged)."""
        cause = e.__cause__ if isinstance(e, _TaskFault) and e.__cause__ is not None else e
        reason = (str(cause) if isinstance(cause, _Recorded) else f"{type(cause).__name__}: {cause}")[:1000]
        if not isinstance(e, _TaskFault):
            self.stats.failures[type(e).__name__] += 1  # a bug: counted by its kind too
        task_id = str(entry.task.get("task_id") or entry.task.get("task", {}).get("id", "?"))
        log.error("task %s dead-lettered (not retried): %s", task_id, reason)
        await self._through_outage(lambda: self.store.tasks.dead_letter(TASK_CONSUMER_GROUP, entry, reason))
        self.stats.tasks_dead_lettered += 1
        self.stats.failures["dead_lettered"] += 1
        if len(self.stats.dead_tasks) < 20:
            self.stats.dead_tasks[task_id] = reason
        if self.stats.groups_written == 0 and self.stats.tasks_dead_lettered >= self.cfg.dead_tasks_to_stop:
            n = self.stats.tasks_dead_lettered
            self._stop_for(PermanentFault(f"the first {n} tasks all failed permanently, the last: {reason}",
                                          fix=fix_for(cause) or "fix the suite's tasks"))  # fmt: skip

    def _stop_for(self, fault: PqrlError) -> None:
        """Stops this manager for a permanent fault (or retries spent); ``run`` raises it."""
        if self.fault is None:
            self.fault = fault
            log.error("%s", fault.line())
        self.abandon()

    async def _outage(self, e: Exception) -> None:
        """The sandbox backend is down: waited for until ``backend_grace_s`` has passed since it was
        first seen down (any episode that ran meanwhile starts the count again), then a job fault."""
        now = time.monotonic()
        self._down_since = self._down_since or now
        self._tell("sandbox backend down", str(e))
        if now - self._down_since > self.cfg.backend_grace_s:
            self._stop_for(PermanentFault(
                f"the sandbox backend is still down after {self.cfg.backend_grace_s:g} s: {e}", fix=fix_for(e)
            ))  # fmt: skip
            raise _JobFault() from e
        await asyncio.sleep(min(max(self.cfg.infra_backoff_s, 0.1), 2.0))

    async def _through_outage(self, write: Any, patience_s: float = 300.0) -> Any:
        """``write()``, retried while Redis is unreachable (a restart: with appendfsync always it comes
        back with every acknowledged write), for up to ``patience_s``. A group is worth minutes of
        generation; a put whose reply was lost may store it twice, and the trainer skips the copy."""
        deadline, delay = time.monotonic() + patience_s, 0.5
        while True:
            try:
                return await write()
            except StoreUnavailable as e:
                if time.monotonic() > deadline:
                    raise
                self._tell("Redis unreachable", str(e))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _episode(self, queued: dict[str, Any], group_id: str, index: int, engine: Engine) -> Trajectory:
        attempt = -1
        while attempt < self.cfg.infra_retries:
            attempt += 1
            try:
                async with asyncio.timeout(self.cfg.episode_deadline_s):
                    t = await run_episode(queued, engine=engine, env=self.env, renderer=self.renderer,
                                          run_id=self.store.run_id, group_id=group_id, index=index,
                                          cfg=self.cfg.episode)  # fmt: skip
                if t.status is Status.FAILED_INFRA and "fault_class" in t.reward_info:  # agent_loop.agent
                    raise _Recorded(t.reward_info)  # a permanent failure the episode recorded
            except TimeoutError:
                self.stats.failures["episode_deadline"] += 1
                await self._back_off(attempt)
                continue
            except (EngineError, EnvServerError, _Recorded) as e:
                fault = fault_of(e)
                if fault is Fault.JOB:
                    what = "engine" if isinstance(e, EngineError) else "env server"
                    self._stop_for(PermanentFault(f"the {what} refuses the job: {e}", fix=fix_for(e)))
                    raise _JobFault() from e
                if fault is Fault.TASK:
                    raise _TaskFault() from e
                if fault is Fault.OUTAGE:
                    await self._outage(e)
                    attempt -= 1  # the grace bounds these waits, not the reruns
                    continue
                self.stats.failures["engine" if isinstance(e, EngineError) else "env"] += 1
                self._tell("engine failed" if isinstance(e, EngineError) else "environment failed", str(e))
                await self._back_off(attempt)
                continue
            self.stats.episodes += 1
            if t.status is not Status.FAILED_INFRA:
                self._down_since = None
            if t.status is Status.FAILED_INFRA:
                self._tell("environment failed", str(t.reward_info.get("error")))
            if t.status is not Status.FAILED_INFRA or attempt == self.cfg.infra_retries:
                if t.status is Status.FAILED_INFRA:
                    self.stats.failures["failed_infra"] += 1
                return t
            self.stats.failures["infra_retry"] += 1
            await self._back_off(attempt)
        return failed_trajectory(
            queued, self.store.run_id, group_id, f"{group_id}-{index}", "engine or deadline"
        )

    async def _back_off(self, attempt: int) -> None:
        if attempt < self.cfg.infra_retries:
            await asyncio.sleep(self.cfg.infra_backoff_s * 2**attempt)

    def _tell(self, what: str, error: str) -> None:
        """Logs each distinct infrastructure error once: the first tells why; repeats only count."""
        key = f"{what}: {error[:200]}"
        if key not in self._told and len(self._told) < 100:
            self._told.add(key)
            log.warning("%s (retried; repeats of this error are not logged): %s", what, error[:500])

    async def _progress(self) -> None:
        gate = await self.store.gate.state()
        policy = await self.store.policy.get()
        elapsed = max(time.monotonic() - self.stats.started, 1e-9)
        failures = ", ".join(f"{k}={v}" for k, v in sorted(self.stats.failures.items())) or "none"
        sampler = "none"
        if self._sampler is not None:
            total = self._sampler.schedule.total
            sampler = f"{await self._sampler.position()}/{'inf' if total is None else total}"
        log.info(
            "[rollout %s] %.2f groups/s | written %d dropped %d culled %d | in flight %d | policy v%d | "
            "gate %s | sampler %s | failures %s",
            self.store.run_id, self.stats.groups_written / elapsed, self.stats.groups_written,
            self.stats.groups_dropped, self.stats.groups_culled, len(self._in_flight), policy.version, gate,
            sampler, failures,
        )  # fmt: skip


class _Recorded(Exception):
    """A failed_infra episode's recorded fault, as the error it was (for ``pqrl.faults``)."""

    def __init__(self, info: dict[str, Any]) -> None:
        super().__init__(str(info.get("error", "")))
        self.status, self.code = info.get("fault_status"), str(info.get("fault_code", ""))


class _JobFault(Exception):
    """A group's end for the manager's permanent fault (``RolloutManager.fault``)."""


class _TaskFault(Exception):
    """A group's end for its task's permanent fault (the cause is ``__cause__``)."""


async def _all_or_none(episodes: list[Any]) -> list[Trajectory]:
    """The episodes' results; the first that raises cancels the others (and is raised)."""
    tasks = [asyncio.ensure_future(e) for e in episodes]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
