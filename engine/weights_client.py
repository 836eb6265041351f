"""The trainer's calls on every engine: new weights (from disk or by broadcast), versions, pausing.

Weights from disk: ``update_weights_from_disk``. SGLang's NCCL path: ``init_weights_update_group``
once, then ``update_weights_from_distributed`` per version while the trainer broadcasts the tensors
(``trainer.weight_sync``), and ``destroy_weights_update_group`` at the end.

Floor module: imports only the standard library, httpx and pydantic.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any, Literal

from engine.errors import EngineUnavailable, WeightUpdateFailed
from engine.pool import Server, ServerPool
from engine.types import (
    DestroyWeightsUpdateGroupRequest,
    InitWeightsUpdateGroupRequest,
    LoadLoRAAdapterRequest,
    ModelInfo,
    PauseRequest,
    UnloadLoRAAdapterRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    parse_version,
)

__all__ = ["WeightUpdates"]


def _served_version(model_info: dict[str, Any]) -> int:
    """The weight version a server reports in its ``/model_info`` answer."""
    return parse_version(ModelInfo.model_validate(model_info).weight_version)


def _body(request: Any) -> dict[str, Any]:
    """The fields the caller set, so servers of other SGLang versions get nothing they do not know."""
    return request.model_dump(mode="json", exclude_unset=True, exclude_none=True)


class WeightUpdates(ServerPool):
    """Weight updates and generation control on every server of the pool (arguments: ``ServerPool``)."""

    async def update_weights_from_disk(
        self,
        model_path: str,
        version: int,
        *,
        abort_all_requests: bool = True,
        flush_cache: bool = True,
        load_format: str | None = None,
        skip_unreachable: bool = False,
    ) -> list[dict[str, Any]]:
        """Loads a Hugging Face checkpoint directory on every server and sets its weight version.

        With ``abort_all_requests`` (default) in-flight generations end with finish reason abort and
        ``generate`` resumes them on the new weights, so per-token versions stay exact. With
        ``skip_unreachable`` a server that refuses connections (down, restarting) is left out
        instead of failing the call: it loads the run's weights when it is back
        (``catch_up_from_disk``).

        Raises:
            WeightUpdateFailed: some server failed; the message names each and why.
        """
        request = UpdateWeightsFromDiskRequest(
            model_path=model_path,
            abort_all_requests=abort_all_requests,
            weight_version=str(version),
            flush_cache=flush_cache,
            load_format=load_format,
        )
        results = await asyncio.gather(*(self._load_from_disk(s, request) for s in self.servers),
                                       return_exceptions=True)  # fmt: skip
        return self._settle("weight update", list(results), version, skip_unreachable)

    async def _load_from_disk(self, server: Server, request: UpdateWeightsFromDiskRequest) -> Any:
        """One server loads a checkpoint directory: its answer (``success``, ``message``)."""
        return await self._control(server, "POST", "/update_weights_from_disk", _body(request))

    async def _served_versions(self) -> list[int | BaseException]:
        """The weight version each server serves, or why it did not say."""
        infos = await self._on_all("GET", "/model_info", None)
        return [r if isinstance(r, BaseException) else _served_version(r) for r in infos]

    async def catch_up_from_disk(self, model_path: str, version: int) -> list[str]:
        """Loads ``model_path`` as ``version`` on each server that serves an older version (an engine
        restarted with its base weights); returns the URLs updated. A server that does not answer, or
        fails to load, is left for the next call: it is down, and catching up is retried."""
        served = await self._served_versions()
        behind = [
            s
            for s, v in zip(self.servers, served, strict=True)
            if not isinstance(v, BaseException) and v < version
        ]
        request = UpdateWeightsFromDiskRequest(model_path=model_path, weight_version=str(version),
                                               abort_all_requests=True, flush_cache=True)  # fmt: skip
        results = await asyncio.gather(
            *(self._load_from_disk(s, request) for s in behind), return_exceptions=True
        )
        updated = []
        for s, r in zip(behind, results, strict=True):
            if not isinstance(r, BaseException) and r.get("success", False):
                s.known_version = version
                updated.append(s.url)
        return updated

    def weights_group_layout(self, ranks_per_server: int | Sequence[int] = 1) -> tuple[list[int], int]:
        """The rank offset of each server in a weights group, and the group's world size.

        The trainer is rank 0; server i holds ``ranks_per_server[i]`` ranks (its tensor-parallel
        size; one int: the same for all) from its offset on.
        """
        ranks = (
            [ranks_per_server] * len(self.servers) if isinstance(ranks_per_server, int) else ranks_per_server
        )
        if len(ranks) != len(self.servers) or any(r < 1 for r in ranks):
            raise ValueError(f"need a rank count >= 1 for each of {len(self.servers)} servers, got {ranks}")
        offsets = list(itertools.accumulate(ranks[:-1], initial=1))
        return offsets, 1 + sum(ranks)

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        *,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
        ranks_per_server: int | Sequence[int] = 1,
    ) -> list[dict[str, Any]]:
        """Every server joins the trainer's process group (rank 0 at ``master_address:master_port``).

        Each call returns once every rank of the group joined, the trainer's included: run it
        concurrently with the trainer's own join (``trainer.weight_sync.DistributedWeightSync`` does).

        Raises:
            WeightUpdateFailed: some server did not join; the message names each and why.
        """
        offsets, world_size = self.weights_group_layout(ranks_per_server)
        requests = [
            InitWeightsUpdateGroupRequest(
                master_address=master_address,
                master_port=master_port,
                rank_offset=offset,
                world_size=world_size,
                group_name=group_name,
                backend=backend,
            )
            for offset in offsets
        ]
        results = await asyncio.gather(
            *(
                self._control(s, "POST", "/init_weights_update_group", _body(r))
                for s, r in zip(self.servers, requests, strict=True)
            ),
            return_exceptions=True,
        )
        self._raise_failed("init_weights_update_group", results)
        return results

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[Any],
        shapes: Sequence[Sequence[int]],
        group_name: str,
        weight_version: int,
        *,
        flush_cache: bool = True,
        abort_all_requests: bool = True,
    ) -> list[dict[str, Any]]:
        """Every server receives one broadcast per ``(name, dtype, shape)`` from rank 0, in order, loads
        the tensors and sets its weight version; returns once all answered.

        The trainer must broadcast exactly these tensors concurrently (``DistributedWeightSync.push``).
        With ``abort_all_requests`` (default) in-flight generations end with finish reason abort and
        ``generate`` resumes them on the new weights, so per-token versions stay exact.

        Args:
            dtypes: torch dtypes or their names (``"bfloat16"``; a ``torch.`` prefix is dropped).

        Raises:
            WeightUpdateFailed: some server failed; the message names each and why.
        """
        request = UpdateWeightsFromDistributedRequest(
            names=list(names),
            dtypes=[str(d).removeprefix("torch.") for d in dtypes],
            shapes=[list(shape) for shape in shapes],
            group_name=group_name,
            weight_version=str(weight_version),
            flush_cache=flush_cache,
            abort_all_requests=abort_all_requests,
        )
        return await self._push_weights("/update_weights_from_distributed", request, weight_version)

    async def _push_weights(
        self, path: str, request: Any, version: int, skip_unreachable: bool = False
    ) -> list[dict[str, Any]]:
        """Every server takes the new weights as ``version``, or the call fails naming each that did not."""
        return self._settle("weight update", await self._on_all("POST", path, _body(request)), version,
                            skip_unreachable)  # fmt: skip

    def _settle(self, what: str, results: list[Any], version: int, skip_unreachable: bool) -> list[Any]:
        """Raises unless every server (but those unreachable, with ``skip_unreachable``) took ``version``;
        records it as each one's known version."""
        reached = [not (skip_unreachable and isinstance(r, EngineUnavailable)) for r in results]
        self._raise_failed(what, [r for r, ok in zip(results, reached, strict=True) if ok],
                           [s for s, ok in zip(self.servers, reached, strict=True) if ok])  # fmt: skip
        for s, ok in zip(self.servers, reached, strict=True):
            if ok:
                s.known_version = version
        return results

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        """Every server leaves the weights group ``group_name``."""
        body = _body(DestroyWeightsUpdateGroupRequest(group_name=group_name))
        results = await self._on_all("POST", "/destroy_weights_update_group", body)
        self._raise_failed("destroy_weights_update_group", results)

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> list[dict[str, Any]]:
        """Every server (SGLang started with ``--enable-lora``) loads the PEFT adapter directory
        ``lora_path`` as ``lora_name``; generations name it (``EngineClient(lora_name=...)``). The
        built-in engine takes an adapter through ``update_weights_from_disk`` instead (merged).

        Raises:
            WeightUpdateFailed: some server did not load it; the message names each and why.
        """
        body = _body(LoadLoRAAdapterRequest(lora_name=lora_name, lora_path=lora_path))
        results = await self._on_all("POST", "/load_lora_adapter", body)
        self._raise_failed("load_lora_adapter", results)
        return results

    async def unload_lora_adapter(self, lora_name: str) -> None:
        """Every server unloads the adapter ``lora_name`` (its requests in flight finish first)."""
        results = await self._on_all(
            "POST", "/unload_lora_adapter", _body(UnloadLoRAAdapterRequest(lora_name=lora_name))
        )
        self._raise_failed("unload_lora_adapter", results)

    async def get_weight_version(self) -> dict[str, int]:
        """The weight version of every server (from ``/model_info``, where SGLang reports it)."""
        served = await self._served_versions()
        for v in served:
            if isinstance(v, BaseException):
                raise v
        return {s.url: int(v) for s, v in zip(self.servers, served, strict=True)}  # type: ignore[arg-type]

    async def pause_generation(self, mode: Literal["abort", "retract", "in_place"] = "abort") -> None:
        await self._on_all("POST", "/pause_generation", _body(PauseRequest(mode=mode)), raise_first=True)

    async def continue_generation(self) -> None:
        await self._on_all("POST", "/continue_generation", {}, raise_first=True)

    async def flush_cache(self) -> None:
        await self._on_all("GET", "/flush_cache", None, raise_first=True)

    def _raise_failed(self, what: str, results: list[Any], servers: Sequence[Any] | None = None) -> None:
        """Raises WeightUpdateFailed naming each server whose answer was an error or ``success: false``."""
        failed = [
            f"{s.url}: {r}"
            if isinstance(r, BaseException)
            else f"{s.url}: {r.get('message') or r.get('error_message')}"
            for s, r in zip(self.servers if servers is None else servers, results, strict=True)
            if isinstance(r, BaseException) or not r.get("success", False)
        ]
        if failed:
            raise WeightUpdateFailed(f"{what} failed on " + "; ".join(failed))
