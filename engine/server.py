"""The built-in engine server (``pqrl engine serve``): SGLang's native HTTP API over transformers.

The subset of DESIGN.md section 4, so one client (``engine.client``) drives this server and a
real SGLang server alike:

    POST /generate                  {input_ids | text, sampling_params, return_logprob, stream, rid}
    POST /update_weights_from_disk  {model_path, load_format, abort_all_requests, weight_version, ...}
    POST /init_weights_update_group {master_address, master_port, rank_offset, world_size, group_name,
                                     backend}: join the trainer's process group ("gloo"; "nccl" on CUDA)
    POST /update_weights_from_distributed  {names, dtypes, shapes, group_name, weight_version,
                                     abort_all_requests, flush_cache}: one broadcast per tensor from rank 0
    POST /destroy_weights_update_group     {group_name}
    GET  /get_weight_version        -> {"weight_version": "3"}
    POST /pause_generation          {"mode": "abort" | "retract" | "in_place"}
    POST /continue_generation
    GET|POST /flush_cache           (no prefix cache here: always succeeds)
    POST /abort_request             {"rid": ..., "abort_all": false}
    GET  /health, GET /get_model_info
    GET  /engine_stats              pqrl extension: step counters, batch sizes

Beyond SGLang, ``meta_info`` carries ``output_token_weight_versions``: the weight version that produced
each output token, exact even when weights change under a running request (retract / in_place pauses,
updates without abort). Errors are ``{"error": code, "detail": message}``; ``stream: true`` is
rejected with 400 (only non-streaming generation is implemented). Batching, sampling and the logprob
convention are documented in ``engine.batcher``; scheduling in ``engine.scheduler``.

Distributed updates receive every tensor before checking any (the sender never waits on a rejected
update), while generation goes on; then, between decode steps, they abort in-flight requests when
asked, copy the tensors in and set the version. Unlike SGLang, a set that does not fit the model
(unknown name, other shape) is refused whole: the served weights stay as they were.

``--backend sglang`` replaces this process with a real SGLang server (``sglang_command``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hmac
import importlib.util
import os
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NoReturn

from fastapi import APIRouter, Body, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.batcher import (
    BatchEngine,
    SamplingParams,
    parse_dtype,
    receive_weights,
)
from engine.batcher import Sequence as EngineSequence
from engine.scheduler import EngineScheduler
from pqrl import collective

__all__ = [
    "SERVE_DEFAULTS",
    "EngineConfig",
    "SGLangNotInstalled",
    "add_serve_arguments",
    "build_engine",
    "create_app",
    "launch_sglang",
    "serve",
    "sglang_command",
]


class SGLangNotInstalled(RuntimeError):
    """``--backend sglang`` on a machine without SGLang."""


# -- request bodies (client -> engine) ------------------------------------------------------------


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not a silent default


class SamplingParamsIn(_In):
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=-1, description="-1 for the whole vocabulary")
    max_new_tokens: int | None = Field(default=128, ge=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = Field(default=None, description="per-request seed (pqrl/SGLang)")

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v == 0 or v < -1:
            raise ValueError("top_k must be -1 (no limit) or >= 1")
        return v

    def to_params(self) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=128 if self.max_new_tokens is None else self.max_new_tokens,
            stop=tuple(stop),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            no_stop_trim=self.no_stop_trim,
            sampling_seed=self.sampling_seed,
        )


class GenerateIn(_In):
    input_ids: list[int] | list[list[int]] | None = None
    text: str | list[str] | None = None
    sampling_params: SamplingParamsIn = Field(default_factory=SamplingParamsIn)
    return_logprob: bool = False
    return_text_in_logprobs: bool = False
    logprob_start_len: int = Field(default=-1, description="input-token logprobs are not supported: -1 only")
    stream: bool = False
    rid: str | list[str] | None = None


class UpdateWeightsFromDiskIn(_In):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True
    # Accepted for SGLang compatibility, no effect here:
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    token_step: int = 0


class InitWeightsUpdateGroupIn(_In):
    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(description="this engine's rank in the group (rank 0 is the trainer)")
    world_size: int = Field(ge=2)
    group_name: str = Field(default="weight_update_group", min_length=1)
    backend: str = "nccl"


class UpdateWeightsFromDistributedIn(_In):
    names: list[str]
    dtypes: list[str] = Field(description='torch dtype names, e.g. "bfloat16"')
    shapes: list[list[Annotated[int, Field(ge=0)]]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None
    # Accepted for SGLang compatibility, no effect here:
    torch_empty_cache: bool = False


class DestroyWeightsUpdateGroupIn(_In):
    group_name: str = "weight_update_group"


class PauseIn(_In):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class AbortIn(_In):
    rid: str = ""
    abort_all: bool = False


# -- response bodies (engine -> client) -----------------------------------------------------------


class MetaInfoOut(BaseModel):
    id: str
    finish_reason: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    weight_version: str
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None
    output_token_weight_versions: list[str]


class GenerateOut(BaseModel):
    text: str
    output_ids: list[int]
    meta_info: MetaInfoOut


class UpdateWeightsOut(BaseModel):
    success: bool
    message: str
    num_paused_requests: int = 0


class ControlOut(BaseModel):
    success: bool
    message: str


class _HttpError(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


# -- engine construction --------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineConfig:
    """How to build the built-in engine.

    ``device="auto"`` picks CUDA when available; ``dtype="auto"`` is float32 on CPU and bfloat16 on
    CUDA. Logprobs are computed in float32 from the model's logits whatever the dtype.
    """

    model: str = "smollm2-135m-instruct"
    device: str = "auto"
    dtype: str = "auto"
    weight_version: str = "0"
    seed: int = 0
    max_running_requests: int = 64
    max_prefill_tokens: int = 8192


def build_engine(config: EngineConfig) -> BatchEngine:
    """Loads the model and tokenizer (a built-in name or a model directory) into a ``BatchEngine``."""
    import torch

    from pqrl.model_cache import load_model, load_tokenizer

    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = config.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    model = load_model(config.model, dtype=getattr(torch, dtype)).to(device)
    return BatchEngine(
        model,
        load_tokenizer(config.model),
        weight_version=config.weight_version,
        seed=config.seed,
        max_running=config.max_running_requests,
        max_prefill_tokens=config.max_prefill_tokens,
    )


# -- the app --------------------------------------------------------------------------------------


def create_app(engine: BatchEngine, *, api_key: str | None = None, model_path: str = "") -> FastAPI:
    """The ASGI app serving ``engine``; its scheduler runs while the app's lifespan does.

    Args:
        engine: the engine (the app's scheduler must be its only user).
        api_key: when set, every route but ``/health`` needs ``Authorization: Bearer <api_key>``.
        model_path: reported by ``/get_model_info``.
    """
    scheduler = EngineScheduler(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await scheduler.start()
        yield
        await scheduler.stop()

    async def authorized(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), api_key.encode()):
            raise _HttpError(401, "unauthorized", "missing or wrong API key")

    app = FastAPI(title="pqrl built-in engine", version="1", lifespan=lifespan)
    app.state.scheduler = scheduler
    api = APIRouter(dependencies=[Depends(authorized)])  # every route but /health

    @app.exception_handler(_HttpError)
    async def http_error(request: Request, exc: _HttpError) -> JSONResponse:
        return JSONResponse({"error": exc.code, "detail": exc.detail}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"error": "invalid_request", "detail": problems}, status_code=422)

    @app.get("/health", operation_id="health")
    async def health() -> JSONResponse:
        up = scheduler.running  # the model is loaded before the app exists; the loop runs once started
        return JSONResponse({"status": "ok" if up else "starting"}, status_code=200 if up else 503)

    @api.get("/get_model_info", operation_id="get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": model_path, "is_generation": True, "weight_version": engine.weight_version}

    @api.get("/get_weight_version", operation_id="get_weight_version")
    async def weight_version() -> dict[str, str]:
        return {"weight_version": engine.weight_version}

    @api.get("/engine_stats", operation_id="engine_stats")
    async def engine_stats() -> dict[str, Any]:
        return scheduler.stats()

    @api.post("/generate", operation_id="generate")
    async def generate(body: GenerateIn, request: Request) -> GenerateOut | list[GenerateOut]:
        prompts, batched = _prompts(body, engine)
        rids = _rids(body.rid, len(prompts))
        params = body.sampling_params.to_params()
        for ids in prompts:
            if engine.max_context is not None and len(ids) >= engine.max_context:
                raise _HttpError(
                    400, "context_too_long", f"{len(ids)} prompt tokens >= context {engine.max_context}"
                )
        busy = [r for r in rids if scheduler.in_flight(r)]
        if busy:
            raise _HttpError(400, "duplicate_rid", f"request id(s) already in flight: {busy}")
        seqs = [EngineSequence(rid, list(ids), params) for rid, ids in zip(rids, prompts, strict=True)]
        futures = [scheduler.submit(s) for s in seqs]
        try:
            done = await _until_done_or_disconnected(request, futures)
        except RuntimeError as e:
            raise _HttpError(500, "engine_error", str(e)) from e
        finally:
            for seq, fut in zip(seqs, futures, strict=True):
                if not fut.done():  # the client left: stop spending compute on it
                    scheduler.abort_soon(seq.rid, "client disconnected")
        outs = [_response(s, body, engine) for s in done]
        return outs if batched else outs[0]

    @api.post("/update_weights_from_disk", operation_id="update_weights_from_disk")
    async def update_weights(body: UpdateWeightsFromDiskIn) -> JSONResponse:
        try:
            n = await scheduler.update_weights_from_disk(
                body.model_path,
                weight_version=body.weight_version,
                load_format=body.load_format,
                abort_all_requests=body.abort_all_requests,
            )
        except (OSError, ValueError, RuntimeError) as e:
            out = UpdateWeightsOut(success=False, message=f"failed to load weights: {e}")
            return JSONResponse(out.model_dump(), status_code=400)
        msg = f"loaded {body.model_path}; weight_version {engine.weight_version}"
        return JSONResponse(UpdateWeightsOut(success=True, message=msg, num_paused_requests=n).model_dump())

    _add_weight_group_routes(api, engine, scheduler)

    @api.post("/pause_generation", operation_id="pause_generation")
    async def pause(body: Annotated[PauseIn | None, Body()] = None) -> dict[str, Any]:
        mode = (body or PauseIn()).mode
        n = await scheduler.pause(mode)
        return {"success": True, "message": f"paused ({mode}); {n} request(s) affected"}

    @api.post("/continue_generation", operation_id="continue_generation")
    async def resume() -> dict[str, Any]:
        await scheduler.resume()
        return {"success": True, "message": "generation continues"}

    @api.api_route("/flush_cache", methods=["GET", "POST"], operation_id="flush_cache")
    async def flush_cache() -> dict[str, Any]:
        return {"success": True, "message": "no prefix cache to flush"}

    @api.post("/abort_request", operation_id="abort_request")
    async def abort_request(body: AbortIn) -> dict[str, Any]:
        if not body.abort_all and not body.rid:
            raise _HttpError(400, "invalid_request", "give a rid or abort_all: true")
        n = await scheduler.abort(None if body.abort_all else body.rid, "aborted by abort_request")
        return {"success": True, "num_aborted": n}

    app.include_router(api)
    return app


# -- weights from a trainer's process group (SGLang's NCCL path) ------------------------------------


@dataclass(frozen=True)
class _WeightsGroup:
    group: Any  # a torch ProcessGroup
    device: Any  # where broadcasts land: the model's CUDA device for nccl, the CPU for gloo


def _add_weight_group_routes(api: APIRouter, engine: BatchEngine, scheduler: EngineScheduler) -> None:
    """The routes of a trainer's weights group: init, update_weights_from_distributed, destroy.

    Answers are SGLang's ``{"success", "message"}``, with status 400 on failure. One lock orders them:
    collectives on a group must run in the same order on every rank.
    """
    groups: dict[str, _WeightsGroup] = {}
    lock = asyncio.Lock()

    @api.post("/init_weights_update_group", operation_id="init_weights_update_group")
    async def init_group(body: InitWeightsUpdateGroupIn) -> JSONResponse:
        if body.backend not in ("gloo", "nccl"):
            return _control(False, f"backend {body.backend!r} is not supported (use 'nccl' or 'gloo')")
        if body.backend == "nccl" and engine.device.type != "cuda":
            return _control(
                False, f"backend 'nccl' needs CUDA; this engine runs on {engine.device}: use 'gloo'"
            )
        if not 0 < body.rank_offset < body.world_size:
            return _control(False, "rank_offset must be in [1, world_size): rank 0 is the trainer")
        async with lock:
            if body.group_name in groups:
                return _control(False, f"group {body.group_name!r} exists: destroy it first")
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
                return _control(False, f"Failed to initialize custom process group: {e}")
            device = engine.device if body.backend == "nccl" else "cpu"
            groups[body.group_name] = _WeightsGroup(group, device)
        return _control(True, "Succeeded to initialize custom process group.")

    @api.post("/update_weights_from_distributed", operation_id="update_weights_from_distributed")
    async def update_from_distributed(body: UpdateWeightsFromDistributedIn) -> JSONResponse:
        # Refusals before receiving leave the sender blocked until the group's timeout; every check
        # against the model comes after receiving.
        wg = groups.get(body.group_name)
        if wg is None:
            return _control(False, f"no group {body.group_name!r}: call /init_weights_update_group first")
        if not len(body.names) == len(body.dtypes) == len(body.shapes):
            return _control(False, "names, dtypes and shapes must have the same length")
        if body.load_format not in (None, "auto"):
            return _control(False, f"load_format {body.load_format!r} is not supported")
        try:
            dtypes = [parse_dtype(d) for d in body.dtypes]
        except ValueError as e:
            return _control(False, str(e))
        async with lock:
            receive = functools.partial(receive_weights, wg.group, body.names, dtypes, body.shapes, wg.device)
            try:
                tensors = await collective.in_daemon_thread(receive, name="engine-weights-group")
                engine.check_state(tensors, source="update_weights_from_distributed", complete=False)
                await scheduler.update_weights_from_tensors(
                    tensors, weight_version=body.weight_version, abort_all_requests=body.abort_all_requests
                )
            except (ValueError, RuntimeError) as e:  # RuntimeError: torch.distributed's errors
                return _control(False, f"Failed to update parameter online: {e}; the weights are unchanged")
        return _control(True, f"Succeeded to update parameter online; weight_version {engine.weight_version}")

    @api.post("/destroy_weights_update_group", operation_id="destroy_weights_update_group")
    async def destroy_group(
        body: Annotated[DestroyWeightsUpdateGroupIn | None, Body()] = None,
    ) -> JSONResponse:
        name = (body or DestroyWeightsUpdateGroupIn()).group_name
        async with lock:
            wg = groups.pop(name, None)
            if wg is None:
                return _control(False, f"no group {name!r} to destroy")
            await asyncio.to_thread(collective.destroy_group, wg.group)
        return _control(True, "Succeeded to destroy custom process group.")


def _control(success: bool, message: str) -> JSONResponse:
    return JSONResponse(
        ControlOut(success=success, message=message).model_dump(), status_code=200 if success else 400
    )


def _prompts(body: GenerateIn, engine: BatchEngine) -> tuple[list[list[int]], bool]:
    """The prompt token lists of a request, and whether it was a batch."""
    if body.stream:
        raise _HttpError(400, "stream_unsupported", "stream=true is not supported by the built-in engine")
    if body.logprob_start_len != -1:
        raise _HttpError(400, "unsupported", "input-token logprobs are not supported (logprob_start_len -1)")
    if (body.input_ids is None) == (body.text is None):
        raise _HttpError(400, "invalid_request", "give exactly one of input_ids or text")
    if body.text is not None:
        texts = [body.text] if isinstance(body.text, str) else body.text
        prompts = [list(engine.tokenizer(t)["input_ids"]) for t in texts]
        batched = not isinstance(body.text, str)
    else:
        ids = body.input_ids or []
        batched = bool(ids) and isinstance(ids[0], list)
        prompts = ids if batched else [ids]  # type: ignore[list-item]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise _HttpError(400, "invalid_request", "empty prompt")
    vocab = engine.vocab_size
    if any(t < 0 or t >= vocab for p in prompts for t in p):
        raise _HttpError(400, "invalid_request", f"token ids must be in [0, {vocab})")
    return prompts, batched  # type: ignore[return-value]


def _rids(rid: str | list[str] | None, n: int) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex for _ in range(n)]
    rids = [rid] if isinstance(rid, str) else rid
    if len(rids) != n or len(set(rids)) != n:
        raise _HttpError(400, "invalid_request", f"need {n} distinct rid(s), got {rids}")
    return rids


async def _until_done_or_disconnected(
    request: Request, futures: list[asyncio.Future[EngineSequence]]
) -> list[EngineSequence]:
    """Awaits the generations, checking every second whether the client is still there."""
    together = asyncio.gather(*(asyncio.shield(f) for f in futures))
    try:
        while True:
            done, _ = await asyncio.wait({together}, timeout=1.0)
            if done:
                return together.result()
            if await request.is_disconnected():
                raise _HttpError(499, "client_closed", "client disconnected")
    finally:
        if not together.done():
            together.cancel()
            together.add_done_callback(_retrieve)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Marks a cancelled future's outcome as seen (no 'exception was never retrieved' noise)."""
    if not fut.cancelled():
        with contextlib.suppress(asyncio.CancelledError):
            fut.exception()


def _response(seq: EngineSequence, body: GenerateIn, engine: BatchEngine) -> GenerateOut:
    logprobs = None
    if body.return_logprob:
        texts = (
            [engine.tokenizer.decode([t]) for t in seq.output_ids]
            if body.return_text_in_logprobs
            else [None] * len(seq.output_ids)
        )
        logprobs = list(zip(seq.logprobs, seq.output_ids, texts, strict=True))
    meta = MetaInfoOut(
        id=seq.rid,
        finish_reason=seq.finish_reason or {},
        prompt_tokens=len(seq.prompt_ids),
        completion_tokens=len(seq.output_ids),
        weight_version=seq.weight_version,
        output_token_logprobs=logprobs,
        output_token_weight_versions=seq.versions,
    )
    return GenerateOut(text=seq.text, output_ids=seq.output_ids, meta_info=meta)


# -- the command ----------------------------------------------------------------------------------


def sglang_command(
    *,
    model_path: str,
    host: str,
    port: int,
    weight_version: str = "0",
    api_key: str | None = None,
    seed: int | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``python -m sglang.launch_server`` command line pqrl needs (``--weight-version``: every
    response then reports an integer version string, as the client expects)."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path]
    cmd += ["--host", host, "--port", str(port), "--weight-version", weight_version]
    if api_key:
        cmd += ["--api-key", api_key]
    if seed is not None:
        cmd += ["--random-seed", str(seed)]
    return cmd + list(extra_args)


SERVE_DEFAULTS: dict[str, Any] = {
    "backend": "builtin",
    "model": "smollm2-135m-instruct",
    "host": "127.0.0.1",
    "port": 30000,
    "device": "auto",
    "dtype": "auto",
    "weight_version": "0",
    "seed": 0,
    "max_running_requests": 64,
    "api_key": None,
    "log_level": "warning",
    "sglang_arg": [],
}


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``pqrl engine serve`` (``serve`` falls back to ``SERVE_DEFAULTS`` for any left out)."""
    d = SERVE_DEFAULTS
    parser.add_argument("--backend", choices=["builtin", "sglang"], default=d["backend"])
    parser.add_argument("--model", default=d["model"], help="built-in model name or a model directory")
    parser.add_argument("--host", default=d["host"])
    parser.add_argument("--port", type=int, default=d["port"])
    parser.add_argument(
        "--device", default=d["device"], help="builtin: cpu, cuda, cuda:1 (auto: cuda if any)"
    )
    parser.add_argument(
        "--dtype", default=d["dtype"], help="builtin: float32, bfloat16 (auto: fp32 CPU, bf16 GPU)"
    )
    parser.add_argument(
        "--weight-version", default=d["weight_version"], help="initial version (integer string)"
    )
    parser.add_argument("--seed", type=int, default=d["seed"])
    parser.add_argument("--max-running-requests", type=int, default=d["max_running_requests"])
    parser.add_argument(
        "--api-key", default=d["api_key"], help="require this bearer key (or PQRL_ENGINE_API_KEY)"
    )
    parser.add_argument("--log-level", default=d["log_level"])
    parser.add_argument(
        "--sglang-arg", action="append", default=[], help="sglang: one more launch_server argument"
    )


def launch_sglang(
    *,
    model: str,
    host: str,
    port: int,
    weight_version: str = "0",
    api_key: str | None = None,
    seed: int | None = None,
    extra_args: Sequence[str] = (),
) -> NoReturn:
    """Replaces this process with a real SGLang server (its signals and exit status are SGLang's).

    Raises:
        SGLangNotInstalled: ``sglang`` is not importable here.
    """
    if importlib.util.find_spec("sglang") is None:
        raise SGLangNotInstalled(
            "SGLang is not installed. On a GPU machine: pip install 'pqrl[sglang]'; "
            "anywhere else use the built-in engine (pqrl engine serve --backend builtin)."
        )
    from pqrl.model_cache import prepare_model

    cmd = sglang_command(
        model_path=str(prepare_model(model)),
        host=host,
        port=port,
        weight_version=weight_version,
        api_key=api_key,
        seed=seed,
        extra_args=extra_args,
    )
    os.execv(cmd[0], cmd)


def serve(args: argparse.Namespace) -> int:
    """Runs ``pqrl engine serve`` with parsed options (names as in ``add_serve_arguments``; missing ones
    take ``SERVE_DEFAULTS``); returns an exit status. Blocks while the server runs."""
    o = {k: getattr(args, k, v) for k, v in SERVE_DEFAULTS.items()}
    api_key = o["api_key"] or os.environ.get("PQRL_ENGINE_API_KEY")
    if o["backend"] == "sglang":
        try:
            launch_sglang(
                model=o["model"],
                host=o["host"],
                port=o["port"],
                weight_version=o["weight_version"],
                api_key=api_key,
                seed=o["seed"],
                extra_args=o["sglang_arg"] or (),
            )
        except SGLangNotInstalled as e:
            print(f"pqrl engine serve: {e}", file=sys.stderr)
            return 2
    import uvicorn

    from pqrl.model_cache import prepare_model

    config = EngineConfig(
        model=o["model"],
        device=o["device"],
        dtype=o["dtype"],
        weight_version=o["weight_version"],
        seed=o["seed"],
        max_running_requests=o["max_running_requests"],
    )
    app = create_app(build_engine(config), api_key=api_key, model_path=str(prepare_model(o["model"])))
    uvicorn.run(app, host=o["host"], port=o["port"], log_level=o["log_level"], timeout_keep_alive=30)
    return 0
