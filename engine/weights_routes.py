"""The built-in server's weight-update routes: from a checkpoint directory, or from a trainer's
process group (SGLang's NCCL path; gloo on CPU).

    POST /update_weights_from_disk         {model_path, load_format, abort_all_requests, weight_version}
    POST /init_weights_update_group        {master_address, master_port, rank_offset, world_size,
                                            group_name, backend}: join the trainer's process group
    POST /update_weights_from_distributed  {names, dtypes, shapes, group_name, weight_version,
                                            abort_all_requests, flush_cache}: one broadcast per tensor
    POST /destroy_weights_update_group     {group_name}

Answers are SGLang's ``{"success", "message"}``, with status 400 on failure. Distributed updates
receive every tensor before checking any (the sender never waits on a rejected update), while
generation goes on; then, between decode steps, they abort in-flight requests when asked, copy the
tensors in and set the version. Unlike SGLang, a set that does not fit the model (unknown name,
other shape) is refused whole: the served weights stay as they were.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse

from engine.batcher import BatchEngine
from engine.scheduler import EngineScheduler
from engine.types import (
    ControlResponse,
    DestroyWeightsUpdateGroupRequest,
    InitWeightsUpdateGroupRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    UpdateWeightsResponse,
)
from engine.weights_loading import parse_dtype, receive_weights
from pqrl import collective

__all__ = ["WeightRoutes"]


@dataclass(frozen=True)
class _WeightsGroup:
    group: Any  # a torch ProcessGroup
    device: Any  # where broadcasts land: the model's CUDA device for nccl, the CPU for gloo


def _reply(response: ControlResponse) -> JSONResponse:
    return JSONResponse(response.model_dump(), status_code=200 if response.success else 400)


def _answer(success: bool, message: str) -> JSONResponse:
    return _reply(ControlResponse(success=success, message=message))


class WeightRoutes:
    """The weight-update routes of one engine. One lock orders the group routes: collectives on a
    group must run in the same order on every rank."""

    def __init__(self, engine: BatchEngine, scheduler: EngineScheduler) -> None:
        self.engine, self.scheduler = engine, scheduler
        self.groups: dict[str, _WeightsGroup] = {}
        self.lock = asyncio.Lock()

    def register(self, api: APIRouter) -> None:
        for path, handler in (
            ("/update_weights_from_disk", self.from_disk),
            ("/init_weights_update_group", self.init_group),
            ("/update_weights_from_distributed", self.from_distributed),
            ("/destroy_weights_update_group", self.destroy_group),
        ):
            api.post(path, operation_id=path.removeprefix("/"))(handler)

    async def from_disk(self, body: UpdateWeightsFromDiskRequest) -> JSONResponse:
        try:
            n = await self.scheduler.update_weights_from_disk(
                body.model_path,
                weight_version=body.weight_version,
                load_format=body.load_format,
                abort_all_requests=body.abort_all_requests,
            )
        except (OSError, ValueError, RuntimeError) as e:
            return _reply(UpdateWeightsResponse(success=False, message=f"failed to load weights: {e}"))
        msg = f"loaded {body.model_path}; weight_version {self.engine.weight_version}"
        return _reply(UpdateWeightsResponse(success=True, message=msg, num_paused_requests=n))

    async def init_group(self, body: InitWeightsUpdateGroupRequest) -> JSONResponse:
        if body.backend not in ("gloo", "nccl"):
            return _answer(False, f"backend {body.backend!r} is not supported (use 'nccl' or 'gloo')")
        if body.backend == "nccl" and self.engine.device.type != "cuda":
            return _answer(
                False, f"backend 'nccl' needs CUDA; this engine runs on {self.engine.device}: use 'gloo'"
            )
        if not 0 < body.rank_offset < body.world_size:
            return _answer(False, "rank_offset must be in [1, world_size): rank 0 is the trainer")
        async with self.lock:
            if body.group_name in self.groups:
                return _answer(False, f"group {body.group_name!r} exists: destroy it first")
            make = functools.partial(
                collective.init_weights_group,
                body.master_address,
                body.master_port,
                rank=body.rank_offset,  # the built-in engine is one rank
                world_size=body.world_size,
                group_name=body.group_name,
                backend=body.backend,
            )
            try:
                group = await collective.in_daemon_thread(make, name="engine-weights-group")
            except Exception as e:  # rendezvous timeouts, refused connections, backend errors
                return _answer(False, f"Failed to initialize custom process group: {e}")
            device = self.engine.device if body.backend == "nccl" else "cpu"
            self.groups[body.group_name] = _WeightsGroup(group, device)
        return _answer(True, "Succeeded to initialize custom process group.")

    async def from_distributed(self, body: UpdateWeightsFromDistributedRequest) -> JSONResponse:
        # Refusals before receiving leave the sender blocked until the group's timeout; every check
        # against the model comes after receiving.
        wg = self.groups.get(body.group_name)
        if wg is None:
            return _answer(False, f"no group {body.group_name!r}: call /init_weights_update_group first")
        if not len(body.names) == len(body.dtypes) == len(body.shapes):
            return _answer(False, "names, dtypes and shapes must have the same length")
        if body.load_format not in (None, "auto"):
            return _answer(False, f"load_format {body.load_format!r} is not supported")
        try:
            dtypes = [parse_dtype(d) for d in body.dtypes]
        except ValueError as e:
            return _answer(False, str(e))
        async with self.lock:
            receive = functools.partial(receive_weights, wg.group, body.names, dtypes, body.shapes, wg.device)
            try:
                tensors = await collective.in_daemon_thread(receive, name="engine-weights-group")
                self.engine.check_state(tensors, source="update_weights_from_distributed", complete=False)
                await self.scheduler.update_weights_from_tensors(
                    tensors, weight_version=body.weight_version, abort_all_requests=body.abort_all_requests
                )
            except (ValueError, RuntimeError) as e:  # RuntimeError: torch.distributed's errors
                return _answer(False, f"Failed to update parameter online: {e}; the weights are unchanged")
        version = self.engine.weight_version
        return _answer(True, f"Succeeded to update parameter online; weight_version {version}")

    async def destroy_group(
        self, body: Annotated[DestroyWeightsUpdateGroupRequest | None, Body()] = None
    ) -> JSONResponse:
        name = (body or DestroyWeightsUpdateGroupRequest()).group_name
        async with self.lock:
            wg = self.groups.pop(name, None)
            if wg is None:
                return _answer(False, f"no group {name!r} to destroy")
            await asyncio.to_thread(collective.destroy_group, wg.group)
        return _answer(True, "Succeeded to destroy custom process group.")
