"""The engine client: SGLang's native HTTP API, for the built-in engine and real SGLang servers alike.

Rollouts call ``generate`` (``EngineClient`` is the HTTP ``engine.protocol.Engine``); the trainer's weight
sync calls the weight-update methods ``EngineClient`` inherits from ``engine.weights_client``.

Routing: a generation goes to the server with the fewest generations this client has in flight there
(ties: the one picked least recently); every later call with the same ``rollout_id`` goes to the same
server while it answers (SGLang's prefix cache then holds the rollout's conversation).

Retries only where safe: a connection that could not be established (nothing was sent) is tried
again, on another server when there is one. Once a request may have reached a server it is never
sent again: a dropped connection, a timeout or an error status raise ``EngineRequestFailed`` /
``EngineHTTPError``. The one exception is the abort-resume path: a generation that the engine ended
with finish reason ``abort`` (e.g. a weight update with ``abort_all_requests``) returned its tokens,
so it is continued by a new request with prompt + tokens so far and the remaining token budget.

Per-token versions: each token keeps the weight version of the response that produced it, so across
an abort-resume the versions change exactly at the first resumed token. The built-in engine also
reports the version of every token (``output_token_weight_versions``), which is used when present.
Versions are integer strings; SGLang's ``"default"`` (no ``--weight-version`` given) counts as 0.

Known limits: a stop string split across a resume boundary is not detected; ``text`` of a resumed
generation is the concatenation of its segments' texts (decode ``output_ids`` for the exact text).

Floor module: imports only the standard library, httpx and pydantic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

import httpx

from engine.errors import (
    EngineError,
    EngineHTTPError,
    EngineRequestFailed,
    EngineUnavailable,
    WeightUpdateFailed,
)
from engine.pool import Server
from engine.types import (
    AbortRequest,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    Generation,
    SamplingParams,
    parse_version,
)
from engine.weights_client import WeightUpdates

__all__ = [
    "EngineClient",
    "EngineError",
    "EngineHTTPError",
    "EngineRequestFailed",
    "EngineUnavailable",
    "FinishReason",
    "Generation",
    "SamplingParams",
    "WeightUpdateFailed",
]


class EngineClient(WeightUpdates):
    """Async client for one or more SGLang-API servers.

    Args:
        urls, api_key, timeout_s, control_timeout_s, connect_timeout_s, connect_retries,
            retry_backoff_s, transport: as for ``engine.pool.ServerPool``.
        down_s: how long a server that refused a connection is avoided.
        max_resumes: most abort-resumes of one generation.
        versions_from: ``"response"``: a segment's tokens get its response's version (exact when updates
            abort in-flight requests, as ``update_weights_from_disk`` does by default). ``"lower_bound"``:
            when the response reports a newer version than this client last saw from that server, the
            segment gets the older one, the lowest it may have (engines paused with retract/in_place).
            Per-token versions from the engine win over both.
        lora_name: every generation uses this LoRA adapter, loaded on SGLang servers by name
            (``load_lora_adapter``); None: the served weights as they are.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        down_s: float = 5.0,
        max_resumes: int = 16,
        versions_from: Literal["response", "lower_bound"] = "response",
        lora_name: str | None = None,
        **connection: Any,
    ) -> None:
        super().__init__(urls, **connection)  # api_key, timeouts, retries, transport: see ServerPool
        self.down_s = down_s
        self.max_resumes = max_resumes
        self.versions_from = versions_from
        self.lora_name = lora_name
        self._sticky: OrderedDict[str, Server] = OrderedDict()
        self._sticky_capacity = 100_000
        self._picks = itertools.count()
        self._cancelled: set[str] = set()
        self._rid_server: dict[str, Server] = {}

    @property
    def in_flight(self) -> dict[str, int]:
        """Generations in flight per server URL."""
        return {s.url: s.in_flight for s in self.servers}

    def release(self, rollout_id: str) -> None:
        """Forgets the server of a finished rollout."""
        self._sticky.pop(rollout_id, None)

    # -- generation -------------------------------------------------------------------------------

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        *,
        rollout_id: str | None = None,
        rid: str | None = None,
    ) -> Generation:
        """Generates with logprobs, resuming generations the engine aborted, until a real finish.

        Args:
            input_ids: the prompt tokens.
            sampling_params: defaults to ``SamplingParams()``.
            rollout_id: requests with the same id go to the same server.
            rid: the engine request id (for ``abort``); a fresh one when None.

        Raises:
            EngineUnavailable: no server could be reached (nothing was sent).
            EngineRequestFailed: the connection broke after sending; not retried.
            EngineHTTPError: the server rejected the request.
        """
        params = sampling_params or SamplingParams()
        rid = rid or uuid.uuid4().hex
        key = rollout_id or rid  # resumes go back to the server that holds the prefix
        prompt = list(input_ids)
        out_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        texts: list[str] = []
        segments = 0
        try:
            while True:
                budget = params.max_new_tokens - len(out_ids)
                req = GenerateRequest(
                    input_ids=prompt + out_ids,
                    sampling_params=dataclasses.replace(params, max_new_tokens=budget),
                    return_logprob=True,
                    rid=rid,
                    lora_path=self.lora_name,
                )
                server, resp, sent_at = await self._post_generate(req, key)
                segments += 1
                seg_logprobs, seg_versions = self._segment(server, resp, sent_at)
                out_ids += resp.output_ids
                logprobs += seg_logprobs
                versions += seg_versions
                texts.append(resp.text)
                finish = resp.meta_info.finish_reason or FinishReason(
                    type="abort", message="no finish reason"
                )
                if finish.type != "abort" or rid in self._cancelled or len(out_ids) >= params.max_new_tokens:
                    break
                if segments > self.max_resumes:
                    break
                if not resp.output_ids:  # aborted before any token (e.g. still updating): do not spin
                    await asyncio.sleep(min(self.retry_backoff_s * 2 ** min(segments, 6), 5.0))
        finally:
            self._cancelled.discard(rid)
            self._rid_server.pop(rid, None)
        if finish.type == "length" or (finish.type == "abort" and len(out_ids) >= params.max_new_tokens):
            finish = FinishReason(type="length", length=len(out_ids))
        return Generation(
            output_ids=out_ids,
            logprobs=logprobs,
            versions=versions,
            finish_reason=finish,
            text="".join(texts),
            prompt_tokens=len(prompt),
            segments=segments,
            server=server.url,
        )

    async def abort(self, rid: str) -> None:
        """Aborts generation ``rid`` (it returns with finish reason abort and is not resumed)."""
        self._cancelled.add(rid)
        server = self._rid_server.get(rid)
        for s in [server] if server else self.servers:
            await self._control(
                s, "POST", "/abort_request", AbortRequest(rid=rid).model_dump(exclude_unset=True)
            )

    async def _post_generate(
        self, req: GenerateRequest, key: str | None
    ) -> tuple[Server, GenerateResponse, int | None]:
        """One ``/generate``; returns the server, its response and the version known when sending."""
        body = self._generate_body(req)
        last: Exception | None = None
        for attempt in range(self.connect_retries + 1):
            server = self._pick(key)
            sent_at_version = server.known_version
            if req.rid:
                self._rid_server[req.rid] = server
            server.in_flight += 1
            try:
                r = await self._http.post(
                    f"{server.url}{self.generate_path}", json=body, timeout=self._gen_timeout
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                last = e  # the connection never opened: nothing was sent, so trying again is safe
                await self._mark_down(server, attempt)
                continue
            except httpx.TransportError as e:
                where = f"{server.url}{self.generate_path}"
                raise EngineRequestFailed(
                    f"{where}: {type(e).__name__}: {e}; not retried: the request may have run"
                ) from e
            finally:
                server.in_flight -= 1
            if r.status_code >= 400:
                raise EngineHTTPError(f"{server.url}{self.generate_path}", r.status_code, r.text)
            resp = self._generate_response(r.json(), req)
            self._saw(server, resp)
            return server, resp, sent_at_version
        urls = ", ".join(s.url for s in self.servers)
        raise EngineUnavailable(f"no engine accepted a connection ({urls}): {last}")

    generate_path = "/generate"

    def _generate_body(self, req: GenerateRequest) -> dict[str, Any]:
        """The generate route's request body (another engine's client translates)."""
        return req.model_dump(mode="json", exclude_unset=True, exclude_none=True)

    def _generate_response(self, answer: Any, req: GenerateRequest) -> GenerateResponse:
        """The generate route's answer as SGLang's ``GenerateResponse``."""
        return GenerateResponse.model_validate(answer)

    def _pick(self, key: str | None) -> Server:
        now = time.monotonic()
        sticky = self._sticky.get(key) if key else None
        if sticky is not None and sticky.down_until <= now:
            self._sticky.move_to_end(key)  # type: ignore[arg-type]
            return sticky
        up = [s for s in self.servers if s.down_until <= now] or self.servers
        server = min(up, key=lambda s: (s.in_flight, s.last_pick))
        server.last_pick = next(self._picks)
        if key:
            self._sticky[key] = server
            self._sticky.move_to_end(key)
            while len(self._sticky) > self._sticky_capacity:
                self._sticky.popitem(last=False)
        return server

    async def _mark_down(self, server: Server, attempt: int) -> None:
        now = time.monotonic()
        server.down_until = now + self.down_s
        if all(s.down_until > now for s in self.servers):  # nowhere else to go: wait before trying again
            await asyncio.sleep(self.retry_backoff_s * 2**attempt)
            for s in self.servers:
                s.down_until = 0.0

    def _saw(self, server: Server, resp: GenerateResponse) -> None:
        meta = resp.meta_info
        if meta.finish_reason is not None and meta.finish_reason.type == "abort":
            server.known_version = None  # an update may be under way: the next response tells
        elif meta.weight_version is not None:
            server.known_version = max(server.known_version or 0, parse_version(meta.weight_version))

    def _segment(
        self, server: Server, resp: GenerateResponse, sent_at: int | None
    ) -> tuple[list[float], list[int]]:
        """Logprobs and per-token versions of one response."""
        meta, n = resp.meta_info, len(resp.output_ids)
        rows = meta.output_token_logprobs
        if rows is None or len(rows) != n:
            raise EngineError(f"{server.url}: response carries no logprob per output token")
        logprobs = [float(row[0]) for row in rows]
        per_token = meta.output_token_weight_versions
        if per_token is not None and len(per_token) == n:
            return logprobs, [parse_version(v) for v in per_token]
        version = parse_version(meta.weight_version)
        if self.versions_from == "lower_bound" and sent_at is not None:
            version = min(version, sent_at)
        return logprobs, [version] * n
