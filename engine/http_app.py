"""The built-in engine server (``pqrl engine serve``): SGLang's native HTTP API over transformers.

The subset pqrl uses, so one client (``engine.client``) drives this server and a real SGLang server
alike (request and response bodies: ``engine.types``):

    POST /generate                  {input_ids | text, sampling_params, return_logprob, stream, rid}
    POST /update_weights_from_disk, /init_weights_update_group, /update_weights_from_distributed,
         /destroy_weights_update_group: see ``engine.weights_routes``
    GET  /model_info                -> {"model_path", "is_generation", "weight_version": "3"}
                                    (also as /get_model_info, SGLang's deprecated name)
    GET  /get_weight_version        -> {"weight_version": "3"} (pqrl extension; SGLang has no such route)
    POST /pause_generation          {"mode": "abort" | "retract" | "in_place"}
    POST /continue_generation
    GET|POST /flush_cache           (empties the prefix cache)
    POST /abort_request             {"rid": ..., "abort_all": false}
    GET  /health
    GET  /engine_stats              pqrl extension: step counters, batch sizes

Beyond SGLang, ``meta_info`` carries ``output_token_weight_versions``: the weight version that produced
each output token, exact even when weights change under a running request (retract / in_place pauses,
updates without abort). Errors are ``{"error": code, "detail": message}``; ``stream: true`` is
rejected with 400 (only non-streaming generation is implemented). Batching is documented in
``engine.batcher``, sampling and the logprob convention in ``engine.token_sampling``, scheduling in
``engine.scheduler``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from engine.batcher import BatchEngine, Sequence
from engine.scheduler import EngineScheduler
from engine.types import (
    AbortRequest,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    MetaInfo,
    PauseRequest,
)
from engine.weights_routes import WeightRoutes

__all__ = ["create_app"]


class _HttpError(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def create_app(engine: BatchEngine, *, api_key: str | None = None, model_path: str = "") -> FastAPI:
    """The ASGI app serving ``engine``; its scheduler runs while the app's lifespan does.

    Args:
        engine: the engine (the app's scheduler must be its only user).
        api_key: when set, every route but ``/health`` needs ``Authorization: Bearer <api_key>``.
        model_path: reported by ``/model_info``.
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
    app.add_exception_handler(_HttpError, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]

    @app.get("/health", operation_id="health")
    async def health() -> JSONResponse:
        up = scheduler.running  # the model is loaded before the app exists; the loop runs once started
        return JSONResponse({"status": "ok" if up else "starting"}, status_code=200 if up else 503)

    api = APIRouter(dependencies=[Depends(authorized)])  # every route but /health
    _add_generate_route(api, engine, scheduler)
    _add_control_routes(api, engine, scheduler, model_path)
    WeightRoutes(engine, scheduler).register(api)
    app.include_router(api)
    return app


async def _http_error(request: Request, exc: _HttpError) -> JSONResponse:
    return JSONResponse({"error": exc.code, "detail": exc.detail}, status_code=exc.status)


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
    return JSONResponse({"error": "invalid_request", "detail": problems}, status_code=422)


def _add_generate_route(api: APIRouter, engine: BatchEngine, scheduler: EngineScheduler) -> None:
    @api.post("/generate", operation_id="generate", response_model_exclude_none=True)
    async def generate(body: GenerateRequest, request: Request) -> GenerateResponse | list[GenerateResponse]:
        prompts, batched = _prompts(body, engine)
        rids = _rids(body.rid, len(prompts))
        for ids in prompts:
            if engine.max_context is not None and len(ids) >= engine.max_context:
                raise _HttpError(
                    400, "context_too_long", f"{len(ids)} prompt tokens >= context {engine.max_context}"
                )
        busy = [r for r in rids if scheduler.in_flight(r)]
        if busy:
            raise _HttpError(400, "duplicate_rid", f"request id(s) already in flight: {busy}")
        seqs = [
            Sequence(rid, list(ids), body.sampling_params) for rid, ids in zip(rids, prompts, strict=True)
        ]
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


def _add_control_routes(
    api: APIRouter, engine: BatchEngine, scheduler: EngineScheduler, model_path: str
) -> None:
    @api.get("/model_info", operation_id="model_info")
    @api.get("/get_model_info", operation_id="get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": model_path, "is_generation": True, "weight_version": engine.weight_version}

    @api.get("/get_weight_version", operation_id="get_weight_version")
    async def weight_version() -> dict[str, str]:
        return {"weight_version": engine.weight_version}

    @api.get("/engine_stats", operation_id="engine_stats")
    async def engine_stats() -> dict[str, Any]:
        return scheduler.stats()

    @api.post("/pause_generation", operation_id="pause_generation")
    async def pause(body: Annotated[PauseRequest | None, Body()] = None) -> dict[str, Any]:
        mode = (body or PauseRequest()).mode
        n = await scheduler.pause(mode)
        return {"success": True, "message": f"paused ({mode}); {n} request(s) affected"}

    @api.post("/continue_generation", operation_id="continue_generation")
    async def resume() -> dict[str, Any]:
        await scheduler.resume()
        return {"success": True, "message": "generation continues"}

    @api.api_route("/flush_cache", methods=["GET", "POST"], operation_id="flush_cache")
    async def flush_cache() -> dict[str, Any]:
        await scheduler.flush_cache()
        return {"success": True, "message": "prefix cache flushed"}

    @api.post("/abort_request", operation_id="abort_request")
    async def abort_request(body: AbortRequest) -> dict[str, Any]:
        if not body.abort_all and not body.rid:
            raise _HttpError(400, "invalid_request", "give a rid or abort_all: true")
        n = await scheduler.abort(None if body.abort_all else body.rid, "aborted by abort_request")
        return {"success": True, "num_aborted": n}


def _prompts(body: GenerateRequest, engine: BatchEngine) -> tuple[list[list[int]], bool]:
    """The prompt token lists of a request, and whether it was a batch."""
    if body.stream:
        raise _HttpError(400, "stream_unsupported", "stream=true is not supported by the built-in engine")
    if body.logprob_start_len != -1:
        raise _HttpError(400, "unsupported", "input-token logprobs are not supported (logprob_start_len -1)")
    if body.lora_path is not None:  # serving it without the adapter would be silently wrong
        why = "lora_path: the built-in engine serves one adapter, merged by /update_weights_from_disk"
        raise _HttpError(400, "unsupported", why)
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
    request: Request, futures: list[asyncio.Future[Sequence]]
) -> list[Sequence]:
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


def _response(seq: Sequence, body: GenerateRequest, engine: BatchEngine) -> GenerateResponse:
    logprobs = None
    if body.return_logprob:
        texts = (
            [engine.tokenizer.decode([t]) for t in seq.output_ids]
            if body.return_text_in_logprobs
            else [None] * len(seq.output_ids)
        )
        logprobs = [list(row) for row in zip(seq.logprobs, seq.output_ids, texts, strict=True)]
    meta = MetaInfo(
        id=seq.rid,
        finish_reason=FinishReason.model_validate(seq.finish_reason or {"type": "abort"}),
        prompt_tokens=len(seq.prompt_ids),
        completion_tokens=len(seq.output_ids),
        weight_version=seq.weight_version,
        output_token_logprobs=logprobs,
        output_token_weight_versions=seq.versions,
    )
    return GenerateResponse(text=seq.text, output_ids=seq.output_ids, meta_info=meta)
