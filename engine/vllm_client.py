"""The engine client for vLLM servers (``engine.vllm`` starts them): ``EngineClient``'s routing,
retries and abort-resume over vLLM's own API.

Generation: ``POST /inference/v1/generate``, vLLM's token-in token-out route: prompt token ids in,
output token ids out with one logprob per token (the server runs with ``processed_logprobs``, so
it is the logprob under the temperature-scaled distribution sampled from) and the weight version of
every token (``weight_versions`` spans). No detokenize/retokenize round trip; only a request with stop
strings asks for text too (vLLM matches stop strings on text).

Weights from disk, per server: ``/pause?mode=abort`` (in-flight requests end with finish reason
abort, their tokens so far returned; new ones wait), ``/collective_rpc`` ``pqrl_reload``
(``engine.vllm_worker``: in place, same architecture, tied embeddings kept tied),
``/update_weight_version``, ``/resume``. The
client resumes aborted generations on the new weights, so a token's version is the weights that
sampled it. Versions are integer strings; a server that never had one set counts as 0.

Floor module: imports only the standard library, httpx and pydantic.
"""

from __future__ import annotations

from typing import Any, Literal

from engine.client import EngineClient
from engine.errors import (
    EngineError,
    EngineUnavailable,
    WeightUpdateFailed,
)
from engine.pool import Server
from engine.types import (
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    MetaInfo,
    UpdateWeightsFromDiskRequest,
    parse_version,
)

__all__ = ["VLLMClient"]


def _served(answer: Any) -> int:
    """The version in a ``/weight_info`` answer (None before any was set: the base weights, 0)."""
    version = answer.get("weight_version") if isinstance(answer, dict) else None
    return parse_version(version) if version not in (None, "", "default") else 0


def vllm_body(req: GenerateRequest) -> dict[str, Any]:
    """The ``/inference/v1/generate`` body of one pqrl generate request."""
    if req.lora_path is not None:  # not sent: it would generate with the base model, silently
        raise ValueError("a vLLM engine here serves no LoRA adapter by name (lora_path)")
    p = req.sampling_params
    sampling: dict[str, Any] = {
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k if p.top_k > 0 else 0,
        "max_tokens": p.max_new_tokens,
        "stop_token_ids": list(p.stop_token_ids),
        "ignore_eos": p.ignore_eos,
        "logprobs": 0,  # the sampled token's own logprob only
        "skip_special_tokens": p.skip_special_tokens,
    }
    if p.sampling_seed is not None:
        sampling["seed"] = p.sampling_seed
    body: dict[str, Any] = {"token_ids": req.input_ids, "sampling_params": sampling}
    if p.stop:
        sampling |= {"stop": list(p.stop), "include_stop_str_in_output": p.no_stop_trim, "detokenize": True}
        body["output_mode"] = "text"
    else:
        sampling["detokenize"] = False
    if req.rid:
        body["request_id"] = req.rid
    return body


def _finish(choice: dict[str, Any], n: int) -> FinishReason:
    kind = choice.get("finish_reason") or "abort"
    if kind == "length":
        return FinishReason(type="length", length=n)
    if kind == "stop":
        return FinishReason(type="stop", matched=choice.get("stop_reason"))
    return FinishReason(type="abort", message=str(kind))


def sglang_response(answer: dict[str, Any], prompt_tokens: int) -> GenerateResponse:
    """vLLM's generate answer (one choice) in the shape ``EngineClient`` reads."""
    (choice,) = answer["choices"]
    ids = list(choice.get("token_ids") or [])
    content = (choice.get("logprobs") or {}).get("content") or []
    if len(content) != len(ids):
        raise EngineError(f"vLLM returned {len(content)} logprobs for {len(ids)} tokens")
    rows = [[float(c["logprob"]), int(c["token_id"]), None] for c in content]
    versions = ["0"] * len(ids)
    for span in choice.get("weight_versions") or []:
        v = str(_served({"weight_version": span["version"]}))
        versions[span["start"] : span["end"]] = [v] * (span["end"] - span["start"])
    meta = MetaInfo(
        id=str(answer.get("id", "")),
        finish_reason=_finish(choice, len(ids)),
        prompt_tokens=prompt_tokens,
        completion_tokens=len(ids),
        weight_version=versions[-1] if versions else None,
        output_token_logprobs=rows,
        output_token_weight_versions=versions,
    )
    return GenerateResponse(text=choice.get("text") or "", output_ids=ids, meta_info=meta)


class VLLMClient(EngineClient):
    """``EngineClient`` for vLLM servers (arguments: ``EngineClient``). Weight sync is from disk only:
    vLLM's NCCL weight transfer is not wired (``update_weights_from_distributed`` raises)."""

    generate_path = "/inference/v1/generate"

    def _generate_body(self, req: GenerateRequest) -> dict[str, Any]:
        return vllm_body(req)

    def _generate_response(self, answer: Any, req: GenerateRequest) -> GenerateResponse:
        return sglang_response(answer, len(req.input_ids or []))

    async def abort(self, rid: str) -> None:
        self._cancelled.add(rid)
        server = self._rid_server.get(rid)
        for s in [server] if server else self.servers:
            # the generate route names its requests "generate-tokens-<request_id>"
            await self._control(
                s, "POST", "/inference/v1/abort_requests", {"request_ids": [f"generate-tokens-{rid}"]}
            )

    # -- weights ----------------------------------------------------------------------------------

    async def _load_from_disk(self, server: Server, request: UpdateWeightsFromDiskRequest) -> Any:
        """Pause (abort: in-flight requests return what they have; else wait for them to finish, so
        versions stay exact either way), load in place, label the version, resume (always)."""
        mode = "abort" if request.abort_all_requests else "wait"
        try:
            await self._control(server, "POST", f"/pause?mode={mode}", None)
        except EngineUnavailable:
            raise  # down: the caller may skip it (it catches up when back)
        except EngineError as e:
            return {"success": False, "message": f"pause: {e}"}
        try:
            rpc = {
                "method": "pqrl_reload",
                "kwargs": {"weights_path": request.model_path},
            }  # engine.vllm_worker
            await self._control(server, "POST", "/collective_rpc", rpc)
            # no cached prefix of the old weights may be reused under the new label
            await self._control(server, "POST", "/reset_prefix_cache", None)
            await self._control(
                server, "POST", "/update_weight_version", {"new_version": request.weight_version}
            )
        except EngineError as e:
            return {"success": False, "message": f"reload_weights {request.model_path}: {e}"}
        finally:
            await self._control(server, "POST", "/resume", None)
        return {
            "success": True,
            "message": f"loaded {request.model_path} as version {request.weight_version}",
        }

    async def _served_versions(self) -> list[int | BaseException]:
        infos = await self._on_all("GET", "/weight_info", None)
        return [r if isinstance(r, BaseException) else _served(r) for r in infos]

    async def pause_generation(self, mode: Literal["abort", "retract", "in_place"] = "abort") -> None:
        vllm_mode = {"abort": "abort", "retract": "keep", "in_place": "keep"}[mode]
        await self._on_all("POST", f"/pause?mode={vllm_mode}", None, raise_first=True)

    async def continue_generation(self) -> None:
        await self._on_all("POST", "/resume", None, raise_first=True)

    async def flush_cache(self) -> None:
        await self._on_all("POST", "/reset_prefix_cache", None, raise_first=True)

    async def init_weights_update_group(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        raise WeightUpdateFailed(_DISK_ONLY)

    async def update_weights_from_distributed(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        raise WeightUpdateFailed(_DISK_ONLY)


_DISK_ONLY = "vLLM engines take new weights from disk only (services.weight_sync.method: disk)"
