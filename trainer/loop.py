"""The trainer's outer step: read groups from the store, train, publish the new weights.

One ``TrainerLoop.step()``:

1. reads ``groups_per_step`` finished groups through the ``trainer`` consumer group (first the
   groups this consumer took before a restart and never covered by a checkpoint), and with
   ``max_extra_reads`` keeps reading while fewer than that many carry signal (DAPO);
2. runs ``trainer.step.train_step`` on them at the current policy version (in a thread, so the
   event loop keeps serving Redis and the rollout manager); groups it drops (stale, no signal)
   are reported to the staleness gate with ``gate.reject``, so they free their places. With
   ``stream`` (the default, where the step allows it: ``trainer.streaming``) steps 1 and 2
   interleave: each group is backpropagated as soon as it is read and the optimizer steps once
   the last is in, the same update, published that much sooner after the last group arrives;
3. pushes the weights to every engine under the next version (``trainer.weight_sync``: saved in
   Hugging Face format and loaded with ``/update_weights_from_disk`` by default, or broadcast over a
   process group), aborting in-flight requests so per-token versions stay exact, and only then
   publishes that version in Redis.

Exactly-once training across crashes: a group is acknowledged in Redis only after the checkpoint
that includes the step that used it (``checkpoint()``). A trainer killed before that checkpoint
resumes from the previous one and is re-delivered those groups (its own pending entries); one
killed between writing the checkpoint and acknowledging finds the entries in the checkpoint's
``unacked_entries`` and acknowledges them on ``resume()`` instead of training them again. With
``ckpt_dir=None`` (tests, throwaway runs) groups are acknowledged right after their step.

Under ``torchrun`` this loop runs on rank 0 with a ``trainer.ranks.Leader``: the step's groups go
to every rank, and whole weights are gathered from the shards for each publication and checkpoint
(the other ranks run ``trainer.ranks.follow``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engine.client import EngineClient
from pqrl.heap import bound_kernel_cache, trimming
from pqrl.store import GroupEntry, TrajectoryStore
from trainer.batch import StepAborted
from trainer.checkpoint import CheckpointState, save_checkpoint
from trainer.config import LoopConfig
from trainer.metrics import rollout_metrics
from trainer.ranks import Leader
from trainer.rollout_log import RolloutLog
from trainer.screening import screen_group
from trainer.step import train_step
from trainer.streaming import StreamingStep, streamable
from trainer.weight_sync import DiskWeightSync, WeightSync

__all__ = ["STREAM_CONSUMER_GROUP", "LoopConfig", "TrainerLoop", "WholeModel"]

log = logging.getLogger(__name__)

STREAM_CONSUMER_GROUP = "trainer"  # the Redis consumer group through which trainers read groups


def _failpoint(name: str, step: int) -> None:
    """Crash-consistency tests: ``PQRL_FAILPOINT=name:step`` kills the process right here."""
    if os.environ.get("PQRL_FAILPOINT") == f"{name}:{step}":
        os._exit(137)


class WholeModel:
    """A sharded model seen through its gathered state dict, for the weight syncs and checkpoints:
    ``save_pretrained`` writes the whole tensors, ``named_parameters`` yields them."""

    def __init__(self, model: Any, state: dict[str, Any]) -> None:
        self.model, self.state = model, state

    def save_pretrained(self, path: Any, **kwargs: Any) -> None:
        self.model.save_pretrained(path, state_dict=self.state, **kwargs)

    def named_parameters(self) -> Any:
        return ((name, self.state[name]) for name, _ in self.model.named_parameters())


class TrainerLoop:
    """Consumes groups and publishes weights for one run."""

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        store: TrajectoryStore,
        engine: EngineClient | None,
        cfg: LoopConfig,
        *,
        tokenizer: Any = None,
        scheduler: Any = None,
        state: CheckpointState | None = None,
        sync: WeightSync | None = None,
        ref_model: Any = None,
        critic: Any = None,
        leader: Leader | None = None,
    ) -> None:
        self.model, self.optimizer, self.store, self.leader = model, optimizer, store, leader
        self.tokenizer, self.scheduler, self.ref_model, self.critic = tokenizer, scheduler, ref_model, critic
        self.cfg = cfg
        self.state = state or CheckpointState()
        # default: save to disk and have the engines load it (None: save only)
        self.sync: WeightSync = sync or DiskWeightSync(
            engine,
            self.cfg.weights_dir,
            keep=self.cfg.keep_weights,
            tokenizer=tokenizer,
            merged=self.cfg.publish_merged,
        )
        self._redelivered: list[GroupEntry] | None = None  # own pending groups, read once
        self._gathered: WholeModel | None = None  # sharded: the weights last published, until they change
        self._consumed: set[str] | None = None  # group ids consumed so far (from the checkpoint on)
        self._duplicates: list[str] = []  # entries of groups consumed before, acknowledged with the step
        self._taken: list[str] = []  # group ids the step in progress has read
        self._abort = threading.Event()  # asks a one-process step's thread to stop (see abort)
        self._waiting = False  # the step has not trained yet: cancelling it changes nothing
        self.flat_read = 0  # groups without signal the step in progress has read (and given back)
        # Training and checkpointing run on this one thread, not on whichever of the event loop's
        # pool threads is free: each thread allocates from its own glibc arena, which keeps pages
        # malloc_trim does not hand back (its top), so the step's allocations stay in one arena.
        # (The quickstart's step-to-step growth came from oneDNN's kernel cache, bounded below;
        # this alone did not change it measurably: bench/results/quickstart_cpu.log.)
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="pqrl-train")
        weakref.finalize(self, self._compute.shutdown, wait=False)
        bound_kernel_cache()  # before the first step's matmuls: see pqrl.heap
        self.rollout_log = (
            None
            if cfg.rollout_log_dir is None
            else RolloutLog(
                cfg.rollout_log_dir,
                keep_steps=cfg.rollout_log_keep_steps,
                tokenizer=tokenizer,
                resumed_at=self.state.step,
            )  # fmt: skip
        )
        self._record: dict[str, dict[str, Any]] | None = None  # the step's logprobs and advantages
        why = streamable(cfg.step, ref_model=ref_model, critic=critic, sharded=leader is not None)
        self.streams = cfg.stream and why is None  # see _stream
        if cfg.stream and why is not None:
            log.info("train.stream is off for this run: %s", why)

    async def resume(self, *, live_managers: bool = False) -> int:
        """After loading a checkpoint: acknowledge what it covers, serve its weights under a fresh
        version above every version ever published; returns that version. ``live_managers``: rollout
        workers of the run may be mid-group (``AdmissionGate.reset``)."""
        await self.store.groups.create_consumer_group(STREAM_CONSUMER_GROUP)
        await self.store.groups.ack(STREAM_CONSUMER_GROUP, self.state.unacked_entries)
        self.state.unacked_entries = []
        highest = max((await self.store.policy.get()).version, self.state.policy_version)
        version = await self._publish(highest + 1)
        self.state.policy_version = version
        await self.store.gate.reset(groups_per_step=self.cfg.groups_per_step, live_managers=live_managers)
        return version

    async def step(self, *, timeout_s: float | None = None) -> dict[str, float]:
        """One step; returns its metrics (with ``policy/version`` after publication)."""
        self._waiting = True
        self._abort.clear()
        self.flat_read = 0
        await self.store.groups.create_consumer_group(STREAM_CONSUMER_GROUP)
        version = (await self.store.policy.get()).version  # only this loop publishes
        self._taken = []
        # the sharded step runs on every rank: its logprobs stay there
        self._record = {} if self.rollout_log is not None and self.leader is None else None
        try:
            if self.streams:
                entries, rejected, metrics = await self._stream(version, timeout_s)
            else:
                entries, rejected = await self._read_step(version, timeout_s)
                _failpoint("read", self.state.step + 1)
                self._gathered = None  # the step changes the weights
                t0 = time.perf_counter()
                self._waiting = False
                metrics = await self._train([e.trajectories for e in entries], version)
                metrics["perf/train_s"] = time.perf_counter() - t0
        except StepAborted:  # raised before any update
            self._give_back_reads()
            raise
        except (asyncio.CancelledError, TimeoutError):
            if self._waiting:  # while reading: nothing updated
                self._give_back_reads()
            raise
        groups = [e.trajectories for e in entries]
        if self.rollout_log is not None:  # written on the log's own thread while this step publishes
            await asyncio.to_thread(self.rollout_log.flush)  # the previous step's file, done long since
            self.rollout_log.submit(self.state.step + 1, version, groups, self.cfg.step, self._record)
        _failpoint("trained", self.state.step + 1)
        metrics |= rollout_metrics(groups)
        dropped = int(
            metrics.get("dropped/groups_too_few_valid", 0) + metrics.get("dropped/no_signal_groups", 0)
        )
        if dropped > rejected:
            await self.store.gate.reject(dropped - rejected)
        if metrics.get("rollout/trajectories_used", 0) > 0:
            metrics["policy/version"] = float(await self._publish(version + 1))
        else:
            metrics["policy/version"] = float(version)
        _failpoint("published", self.state.step + 1)
        self.state.step += 1
        self.state.policy_version = int(metrics["policy/version"])
        self.state.trained_groups += [g[0].group_id for g in groups]
        ids = [e.entry_id for e in entries] + self._duplicates
        if self._duplicates:
            metrics["dropped/duplicate_groups"] = float(len(self._duplicates))
            self._duplicates = []
        if self.cfg.ckpt_dir is None:
            await self.store.groups.ack(STREAM_CONSUMER_GROUP, ids)
        else:
            self.state.unacked_entries += ids
        return metrics

    async def _read_step(self, version: int, timeout_s: float | None) -> tuple[list[GroupEntry], int]:
        """The step's groups, read before it trains; and how many were already given back to the gate."""
        gps = self.cfg.groups_per_step
        entries = await self._read(gps, timeout_s)
        rejected = 0
        for _ in range(self.cfg.max_extra_reads):
            flat = sum(not self._has_signal(e, version) for e in entries)
            missing = gps - (len(entries) - flat)
            if missing <= 0:
                break
            if flat > rejected:  # they will be dropped: free their places now, or the gate stays full
                await self.store.gate.reject(flat - rejected)  # and no group with signal can come
                rejected = self.flat_read = flat
            entries += await self._read(missing, timeout_s)
        return entries, rejected

    async def _stream(self, version: int, timeout_s: float | None) -> tuple[list[GroupEntry], int, dict]:
        """Reads the step's groups as ``_read_step`` does (the same rounds, the same bound on extra
        reads) but backpropagates each batch of arrivals at once (``trainer.streaming``); a group
        without signal gives its gate place back as soon as it is read. Then the optimizer step."""
        gps, entries, rejected, signal = self.cfg.groups_per_step, [], 0, 0
        acc = StreamingStep(self.model, self.optimizer, version, self.cfg.step, scheduler=self.scheduler,
                            abort=self._abort, record=self._record)  # fmt: skip
        want, extra = gps, 0
        while True:
            got = 0
            while got < want:
                self._waiting = True
                new = await self._read(want - got, timeout_s, at_least=1)
                self._waiting = False
                got += len(new)
                entries += new
                flat = sum(not self._has_signal(e, version) for e in new)
                signal += len(new) - flat
                if flat:
                    await self.store.gate.reject(flat)
                    rejected += flat
                    self.flat_read = rejected
                with trimming():
                    await self._on_compute(acc.add, [e.trajectories for e in new])
                if self._abort.is_set():  # asked while that ran: nothing is updated yet
                    raise StepAborted("stopped before the optimizer step")
            missing = gps - signal
            if missing <= 0 or extra == self.cfg.max_extra_reads:
                break
            extra, want = extra + 1, missing
        _failpoint("read", self.state.step + 1)
        self._gathered = None  # the step changes the weights
        with trimming():
            metrics = await self._on_compute(acc.finish)
        metrics["perf/train_s"] = acc.busy_s
        return entries, rejected, metrics

    @property
    def waiting(self) -> bool:
        """Whether the step in progress is waiting for groups (cancelling it then loses nothing)."""
        return self._waiting

    def abort(self) -> bool:
        """Asks the step in progress to stop now. False: it is still waiting for groups, so
        cancelling its task loses nothing (the next step reads what it read again); uncancelled, it
        raises ``StepAborted`` within one ``read_block_ms`` as well. True: leave it
        to end by itself: training, it raises ``StepAborted`` before its first optimizer step
        (weights, state and acknowledgements as they were) or, past that point, finishes normally;
        publishing and checkpointing finish normally too."""
        self._abort.set()
        return not self._waiting

    async def _train(self, groups: list[list[Any]], version: int) -> dict[str, float]:
        kwargs = {"scheduler": self.scheduler, "ref_model": self.ref_model, "critic": self.critic}
        # the step's freed activations fragment the heap: its free pages go back while it runs
        with trimming():
            if self.leader is None:
                return await self._on_compute(
                    train_step, self.model, self.optimizer, groups, version, self.cfg.step, **kwargs,
                    abort=self._abort, record=self._record,
                )  # fmt: skip
            # the other ranks are in the step's collectives: it runs to its end
            return await self._on_compute(
                self.leader.train, self.model, self.optimizer, groups, version, self.cfg.step, **kwargs
            )

    def close(self) -> None:
        """Waits for the rollout log's last file."""
        if self.rollout_log is not None:
            self.rollout_log.close()

    async def checkpoint(self, *, sampler_position: int | None = None) -> Path:
        """Writes a checkpoint of the current step, then acknowledges the groups it covers."""
        if self.cfg.ckpt_dir is None:
            raise ValueError("this loop has no ckpt_dir")
        self.state.sampler_position = sampler_position
        model, optimizer_state = self.model, None
        if self.leader is not None:
            model = await self._whole_model()
            optimizer_state = await asyncio.to_thread(self.leader.optimizer_state, self.model, self.optimizer)
        path = await self._on_compute(
            save_checkpoint, self.cfg.ckpt_dir, self.state, model=model, optimizer=self.optimizer,
            scheduler=self.scheduler, tokenizer=self.tokenizer, keep=self.cfg.keep_checkpoints,
            optimizer_state=optimizer_state, critic=self.critic, manifest=self.cfg.manifest,
        )  # fmt: skip
        _failpoint("checkpointed", self.state.step)
        await self.store.groups.ack(STREAM_CONSUMER_GROUP, self.state.unacked_entries)
        self.state.unacked_entries = []
        return path

    async def _on_compute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``asyncio.to_thread`` on the loop's own compute thread."""
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._compute, call)

    def _has_signal(self, entry: GroupEntry, version: int) -> bool:
        return screen_group(entry.trajectories, version, self.cfg.step).dropped is None

    async def _read(
        self, n: int, timeout_s: float | None, *, at_least: int | None = None
    ) -> list[GroupEntry]:
        """Up to ``n`` fresh groups, waiting until ``at_least`` (default ``n``) have come."""
        if self._redelivered is None:
            self._redelivered = await self.store.groups.read_own_pending(
                STREAM_CONSUMER_GROUP, self.cfg.consumer, count=10_000
            )
            held = set(self.state.unacked_entries)  # taken since the last checkpoint, not crashed
            self._redelivered = [e for e in self._redelivered if e.entry_id not in held]
        entries = self._fresh(self._redelivered[:n])
        self._redelivered = self._redelivered[n:]
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while len(entries) < (n if at_least is None else at_least):
            if deadline is not None and loop.time() > deadline:
                raise TimeoutError(f"only {len(entries)} of {n} groups arrived")
            if self._abort.is_set():  # a cancel may be lost on its way (see read_new): stop anyway
                raise StepAborted("stopped while waiting for groups")
            missing = n - len(entries)
            entries += self._fresh(
                await self.store.groups.read(
                    STREAM_CONSUMER_GROUP, self.cfg.consumer, count=missing, block_ms=self.cfg.read_block_ms
                )
            )
        return entries

    def _give_back_reads(self) -> None:
        """The step ends untrained: its groups, pending on this consumer, are read again by the next
        step (a cancelled blocking read may also have left one there that this process never saw)."""
        if self._consumed is not None:
            self._consumed.difference_update(self._taken)
        self._redelivered = None

    def _fresh(self, entries: list[GroupEntry]) -> list[GroupEntry]:
        """Leaves out groups consumed before: a producer that retried a write whose reply was lost (a
        Redis restart) may have stored a group twice. Their entries are acknowledged with the step's."""
        if self._consumed is None:
            self._consumed = set(self.state.trained_groups)
        fresh = []
        for e in entries:
            group_id = e.trajectories[0].group_id
            if group_id in self._consumed:
                self._duplicates.append(e.entry_id)
            else:
                self._consumed.add(group_id)
                self._taken.append(group_id)
                fresh.append(e)
        return fresh

    async def _whole_model(self) -> WholeModel:
        """The gathered weights; gathered once per set of weights (publication, then checkpoint)."""
        assert self.leader is not None
        if self._gathered is None:
            state = await asyncio.to_thread(self.leader.model_state, self.model)
            self._gathered = WholeModel(self.model, state)
        return self._gathered

    async def _publish(self, version: int) -> int:
        model = self.model if self.leader is None else await self._whole_model()
        await self.sync.push(model, version)  # engines first: a published version is one engines serve
        return await self.store.policy.publish(self.sync.location(version), version=version)
