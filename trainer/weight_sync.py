"""Publishing new weights to the engines: one small interface, two ways.

``await sync.push(model, version)`` returns once every engine serves ``model``'s weights as ``version``;
engines abort in-flight generations at the swap and the client resumes them, so per-token versions
stay exact. Nothing may change the parameters while a push runs (call it between optimizer steps).

- ``DiskWeightSync``: save a Hugging Face checkpoint (a LoRA model's adapter only, which the built-in
  engine merges into its base weights; with ``merged``, its whole weights with the adapter merged,
  for engines that load whole weights only), then ``/update_weights_from_disk``. Engines must see
  the directory.
- ``DistributedWeightSync``: SGLang's NCCL path. The trainer is rank 0 of a process group of its own
  with every engine rank (``init``); ``push`` posts ``/update_weights_from_distributed`` with the
  parameters' names, dtypes and shapes while broadcasting each tensor, in that order. ``nccl`` between
  GPUs; ``gloo`` on CPU, which the built-in engine also accepts (that is how the tests run it).

A sharded (FSDP2) trainer passes ``trainer.loop.WholeModel``: whole tensors gathered on rank 0.
``pqrl train`` picks the way from ``services.weight_sync``.

Deliberately left out: buckets (one request carries every parameter, so an engine holds a second copy
of the weights while receiving), SGLang's ``load_format="flattened_bucket"``, and engines joining
mid-run (a group is fixed at ``init``: a new engine needs ``init`` again, and weights from disk until
the next push).
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch

from engine.client import EngineClient, WeightUpdateFailed
from pqrl.collective import broadcast_from_rank0, destroy_group, in_daemon_thread, init_weights_group
from trainer.lora import is_lora, save_weights

__all__ = ["DiskWeightSync", "DistributedWeightSync", "WeightSync", "init_weights_group"]


class WeightSync(Protocol):
    async def push(self, model: Any, version: int) -> None:
        """Returns once every engine serves ``model``'s weights as ``version``.

        Raises:
            WeightUpdateFailed: some engine does not serve them.
        """
        ...

    def location(self, version: int) -> str:
        """Where ``version``'s weights can be found (recorded with the published policy version)."""
        ...


class DiskWeightSync:
    """Checkpoint to ``weights_dir/v{version}``, then ``/update_weights_from_disk`` on every engine.

    Args:
        client: the engines; None saves the weights only (engines that follow the policy in Redis).
        weights_dir: where checkpoints go (engines must read it under the same path).
        keep: most recent checkpoints kept on disk.
        tokenizer: saved with each checkpoint when given.
        merged: a LoRA model is saved whole with its adapter merged, not as the adapter alone.
    """

    def __init__(
        self,
        client: EngineClient | None,
        weights_dir: str | Path,
        *,
        keep: int = 2,
        tokenizer: Any = None,
        merged: bool = False,
    ) -> None:
        self.client, self.weights_dir, self.keep, self.tokenizer = client, Path(weights_dir), keep, tokenizer
        self.merged = merged
        self._saved: list[Path] = []

    def location(self, version: int) -> str:
        return str((self.weights_dir / f"v{version}").resolve())

    async def push(self, model: Any, version: int) -> None:
        path = Path(self.location(version))
        await asyncio.to_thread(self._save, model, path)
        if self.client is not None:
            # an engine that is down loads the run's weights when it is back (the rollout side sees
            # it serving an older version than the run's); one that answered and failed is an error
            try:
                await self.client.update_weights_from_disk(str(path), version, skip_unreachable=True)
            except WeightUpdateFailed as e:
                if not self.merged and is_lora(model):  # SGLang's route takes whole weights only
                    raise WeightUpdateFailed(
                        f"{e} (the engines were sent the LoRA adapter alone: engines other than pqrl's "
                        "built-in one, such as SGLang, need model.lora.publish: merged)"
                    ) from e
                raise
        self._saved.append(path)
        while len(self._saved) > self.keep:
            shutil.rmtree(self._saved.pop(0), ignore_errors=True)

    def _save(self, model: Any, path: Path) -> None:
        save_weights(model, path, merged=self.merged)  # unmerged, a LoRA model's adapter only
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(path)


class DistributedWeightSync:
    """The trainer's side of SGLang's ``/init_weights_update_group`` + ``/update_weights_from_distributed``.

    Args:
        client: the engines; engine i takes ranks from its offset on (``EngineClient.weights_group_layout``).
        master_address: an address of this host that every engine can reach.
        master_port: a free port there; the group's TCPStore listens on it.
        backend: ``"nccl"`` (model on a GPU) or ``"gloo"`` (CPU tensors; GPU parameters are copied).
        group_name: the group's name on every rank.
        ranks_per_server: each engine's rank count (its tensor-parallel size).
        timeout_s: of the rendezvous and of every broadcast.
        grace_s: after an engine's failure answer, how long to wait for the broadcast to end before
            declaring the group out of step (a request refused before receiving leaves the broadcast
            with no receiver).
    """

    def __init__(
        self,
        client: EngineClient,
        *,
        master_address: str = "127.0.0.1",
        master_port: int,
        backend: str = "nccl",
        group_name: str = "weight_update_group",
        ranks_per_server: int | list[int] = 1,
        timeout_s: float = 600.0,
        grace_s: float = 30.0,
    ) -> None:
        self.client = client
        self.master_address, self.master_port = master_address, master_port
        self.backend, self.group_name, self.ranks_per_server = backend, group_name, ranks_per_server
        self.timeout = timedelta(seconds=timeout_s)
        self.grace_s = grace_s
        self.last_broadcast_s = float("nan")  # the last push's broadcast, from its start
        self.last_push_s = float("nan")  # the last push until every engine answered (swap included)
        self._group: Any = None
        self._out_of_step = False

    def location(self, version: int) -> str:
        return f"{self.backend}://{self.master_address}:{self.master_port}/{self.group_name}@v{version}"

    async def __aenter__(self) -> DistributedWeightSync:
        await self.init()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def init(self) -> None:
        """Creates the group as rank 0 (hosting its store) while every engine joins it.

        Raises:
            WeightUpdateFailed: an engine did not join (this side stops waiting at once).
        """
        if self._group is not None:
            raise RuntimeError("the weights group is already initialized")
        _, world_size = self.client.weights_group_layout(self.ranks_per_server)
        join = functools.partial(
            init_weights_group,
            self.master_address,
            self.master_port,
            rank=0,
            world_size=world_size,
            group_name=self.group_name,
            backend=self.backend,
            timeout=self.timeout,
        )
        mine = in_daemon_thread(join)
        theirs = asyncio.ensure_future(
            self.client.init_weights_update_group(
                self.master_address,
                self.master_port,
                group_name=self.group_name,
                backend=self.backend,
                ranks_per_server=self.ranks_per_server,
            )
        )
        await asyncio.wait({mine, theirs}, return_when=asyncio.FIRST_EXCEPTION)
        for fut in (theirs, mine):  # the engines' answer says more than a rendezvous timeout
            if fut.done() and fut.exception() is not None:
                for other in (mine, theirs):
                    other.cancel()
                raise _as_update_failed(fut.exception())  # type: ignore[arg-type]
        self._group = mine.result()
        self._out_of_step = False

    async def push(self, model: Any, version: int) -> None:
        """Broadcasts ``model.named_parameters()`` to every engine, which then serve them as ``version``.

        Raises:
            WeightUpdateFailed: an engine refused or failed; if the broadcast could not finish, the
                group is out of step and every later push fails until ``close`` and ``init``.
        """
        if self._group is None:
            raise RuntimeError("call init() first")
        if self._out_of_step:
            raise WeightUpdateFailed(
                "the weights group is out of step after a failed push: close() and init()"
            )
        if is_lora(model):  # the engines would take adapter tensors for weights of their own
            raise ValueError("a LoRA model's adapter goes to the engines from disk: use DiskWeightSync")
        names, tensors = zip(*((n, self._wire(p)) for n, p in model.named_parameters()), strict=True)
        self.last_broadcast_s = self.last_push_s = float("nan")
        start = time.perf_counter()
        sent = in_daemon_thread(functools.partial(broadcast_from_rank0, self._group, list(tensors)))
        sent.add_done_callback(lambda _: setattr(self, "last_broadcast_s", time.perf_counter() - start))
        answered = asyncio.ensure_future(
            self.client.update_weights_from_distributed(
                names, [t.dtype for t in tensors], [t.shape for t in tensors], self.group_name, version
            )
        )
        await asyncio.wait({sent, answered}, return_when=asyncio.FIRST_EXCEPTION)
        if not (sent.done() and answered.done()):  # one side failed: give the other a little time
            await asyncio.wait({sent, answered}, timeout=self.grace_s)
        self.last_push_s = time.perf_counter() - start
        if not sent.done() or sent.exception() is not None:
            self._out_of_step = True
        for fut in (answered, sent):  # the engines' answer first: it names the cause
            if not fut.done():
                fut.cancel()
            elif fut.exception() is not None:
                raise _as_update_failed(fut.exception())  # type: ignore[arg-type]
        if self._out_of_step:
            raise WeightUpdateFailed("the broadcast did not finish within grace_s of the engines' answer")

    async def close(self) -> None:
        """The engines leave the group, then this process does."""
        if self._group is None:
            return
        group, self._group = self._group, None
        try:
            await self.client.destroy_weights_update_group(self.group_name)
        finally:
            if not self._out_of_step:  # a group with a broadcast stuck in it is left to its timeout
                await asyncio.to_thread(destroy_group, group)

    def _wire(self, p: Any) -> Any:
        """A parameter as the backend sends it: detached, contiguous, on the CPU for gloo."""
        t = p.detach()
        if self.backend == "gloo" and t.device.type != "cpu":
            t = t.cpu()
        elif self.backend == "nccl" and t.device.type != "cuda":
            if not torch.cuda.is_available():
                raise ValueError(
                    "backend 'nccl' broadcasts CUDA tensors: put the model on a GPU or use 'gloo'"
                )
            t = t.cuda()  # whole tensors gathered from FSDP2 shards sit on the CPU
        return t.contiguous()


def _as_update_failed(e: BaseException) -> WeightUpdateFailed:
    return e if isinstance(e, WeightUpdateFailed) else WeightUpdateFailed(f"{type(e).__name__}: {e}")
