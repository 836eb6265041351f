"""One async client for SGLang's native HTTP API: the built-in engine and real SGLang servers alike.

Rollouts call ``generate``; the trainer's weight sync calls ``update_weights_from_disk`` or, for SGLang's
NCCL path, ``init_weights_update_group`` once and ``update_weights_from_distributed`` per version (the
tensors themselves go by broadcast, see ``trainer.weight_sync``).

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
import itertools
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "EngineClient",
    "EngineError",
    "EngineHTTPError",
    "EngineRequestFailed",
    "EngineUnavailable",
    "FinishReason",
    "GenerateRequest",
    "GenerateResponse",
    "Generation",
    "MetaInfo",
    "SamplingParams",
    "WeightUpdateFailed",
]


class EngineError(RuntimeError):
    """Base of the engine client's errors."""


class EngineUnavailable(EngineError):
    """No server accepted a connection (after the retries); nothing was sent."""


class EngineRequestFailed(EngineError):
    """The connection failed after the request may have reached the server; it was not retried."""


class EngineHTTPError(EngineError):
    """The server answered with an error status."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {body[:500]}")
        self.url, self.status, self.body = url, status, body


class WeightUpdateFailed(EngineError):
    """At least one server did not load the new weights."""


# -- wire types -----------------------------------------------------------------------------------


class SamplingParams(BaseModel):
    """SGLang ``sampling_params`` (the subset pqrl uses). RL defaults: top_p 1, top_k -1, so the
    behaviour and training distributions agree (DESIGN.md section 4)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = -1
    max_new_tokens: int = Field(default=128, ge=0)
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None


class GenerateRequest(BaseModel):
    """Body of ``POST /generate`` as this client sends it."""

    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = True
    stream: Literal[False] = False
    rid: str | None = None


class FinishReason(BaseModel):
    """``{"type": "stop", "matched": ...}``, ``{"type": "length", "length": n}`` or
    ``{"type": "abort", "message": ...}``."""

    model_config = ConfigDict(extra="allow")

    type: str
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None


class MetaInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = ""
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    weight_version: str | None = None
    output_token_logprobs: list[list[Any]] | None = None  # [logprob, token_id, text_or_null]
    output_token_weight_versions: list[str] | None = None  # built-in engine only


class GenerateResponse(BaseModel):
    """Body of a non-streaming ``/generate`` answer."""

    model_config = ConfigDict(extra="allow")

    text: str = ""
    output_ids: list[int]
    meta_info: MetaInfo


@dataclass(frozen=True)
class Generation:
    """A finished generation, possibly stitched from several segments by the abort-resume path.

    Attributes:
        output_ids: generated tokens, exactly as the engine produced them.
        logprobs: engine logprob of each token (log_softmax(logits / T) at the token).
        versions: weight version that produced each token.
        finish_reason: of the last segment; ``length`` counts all segments' tokens.
        text: the segments' texts, concatenated.
        prompt_tokens: length of the original prompt.
        segments: 1 + the number of resumes.
        server: URL of the server that produced the last segment.
    """

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    text: str
    prompt_tokens: int
    segments: int
    server: str


def parse_version(v: str | None) -> int:
    """An engine's weight version string as an int ("default": never set, i.e. the initial weights)."""
    if v is None or v == "default":
        return 0
    try:
        return int(v)
    except ValueError:
        raise EngineError(
            f"weight_version {v!r} is not an integer: start engines with --weight-version 0"
        ) from None


# -- the client -----------------------------------------------------------------------------------


class _Server:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.in_flight = 0
        self.last_pick = -1
        self.down_until = 0.0
        self.known_version: int | None = None  # newest version this client saw from the server


class EngineClient:
    """Async client for one or more SGLang-API servers.

    Args:
        urls: server base URLs, e.g. ``"http://127.0.0.1:30000"``.
        api_key: sent as ``Authorization: Bearer`` when given.
        timeout_s: read timeout of a generation (None: wait as long as it takes).
        control_timeout_s: timeout of control calls (weight loading can take minutes).
        connect_timeout_s: TCP connect timeout.
        connect_retries: further attempts after a failed connection (nothing sent, so safe).
        retry_backoff_s: base of the exponential wait once every server refused.
        down_s: how long a server that refused a connection is avoided.
        max_resumes: most abort-resumes of one generation.
        versions_from: ``"response"``: a segment's tokens get its response's version (exact when updates
            abort in-flight requests, as ``update_weights_from_disk`` does by default). ``"lower_bound"``:
            when the response reports a newer version than this client last saw from that server, the
            segment gets the older one, the lowest it may have (engines paused with retract/in_place).
            Per-token versions from the engine win over both.
        transport: an httpx transport (tests).
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        api_key: str | None = None,
        timeout_s: float | None = None,
        control_timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        connect_retries: int = 3,
        retry_backoff_s: float = 0.25,
        down_s: float = 5.0,
        max_resumes: int = 16,
        versions_from: Literal["response", "lower_bound"] = "response",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("EngineClient needs at least one server URL")
        self.servers = [_Server(u) for u in urls]
        self.connect_retries = connect_retries
        self.retry_backoff_s = retry_backoff_s
        self.down_s = down_s
        self.max_resumes = max_resumes
        self.versions_from = versions_from
        self._gen_timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s, pool=None)
        self._ctl_timeout = httpx.Timeout(control_timeout_s, connect=connect_timeout_s, pool=None)
        self._sticky: OrderedDict[str, _Server] = OrderedDict()
        self._sticky_capacity = 100_000
        self._picks = itertools.count()
        self._cancelled: set[str] = set()
        self._rid_server: dict[str, _Server] = {}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Keep-alive shorter than servers' (uvicorn: 5 s), so a request is rarely sent on a connection
        # the server is closing: such a request could not be retried.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0)
        self._http = httpx.AsyncClient(headers=headers, limits=limits, transport=transport)

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

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
                    sampling_params=params.model_copy(update={"max_new_tokens": budget}),
                    rid=rid,
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

    async def generate_once(
        self, request: GenerateRequest, *, rollout_id: str | None = None
    ) -> tuple[str, GenerateResponse]:
        """One ``/generate`` call, no resume; returns the server URL and its typed response."""
        try:
            server, resp, _ = await self._post_generate(request, rollout_id)
        finally:
            self._rid_server.pop(request.rid or "", None)
        return server.url, resp

    async def abort(self, rid: str) -> None:
        """Aborts generation ``rid`` (it returns with finish reason abort and is not resumed)."""
        self._cancelled.add(rid)
        server = self._rid_server.get(rid)
        for s in [server] if server else self.servers:
            await self._control(s, "POST", "/abort_request", {"rid": rid})

    async def _post_generate(
        self, req: GenerateRequest, key: str | None
    ) -> tuple[_Server, GenerateResponse, int | None]:
        """One ``/generate``; returns the server, its response and the version known when sending."""
        body = req.model_dump(exclude_none=True)
        body["sampling_params"] = req.sampling_params.model_dump(exclude_none=True)
        last: Exception | None = None
        for attempt in range(self.connect_retries + 1):
            server = self._pick(key)
            sent_at_version = server.known_version
            if req.rid:
                self._rid_server[req.rid] = server
            server.in_flight += 1
            try:
                r = await self._http.post(f"{server.url}/generate", json=body, timeout=self._gen_timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                last = e  # the connection never opened: nothing was sent, so trying again is safe
                await self._mark_down(server, attempt)
                continue
            except httpx.TransportError as e:
                raise EngineRequestFailed(
                    f"{server.url}/generate: {type(e).__name__}: {e}; not retried: the request may have run"
                ) from e
            finally:
                server.in_flight -= 1
            if r.status_code >= 400:
                raise EngineHTTPError(f"{server.url}/generate", r.status_code, r.text)
            resp = GenerateResponse.model_validate(r.json())
            self._saw(server, resp)
            return server, resp, sent_at_version
        urls = ", ".join(s.url for s in self.servers)
        raise EngineUnavailable(f"no engine accepted a connection ({urls}): {last}")

    def _pick(self, key: str | None) -> _Server:
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

    async def _mark_down(self, server: _Server, attempt: int) -> None:
        now = time.monotonic()
        server.down_until = now + self.down_s
        if all(s.down_until > now for s in self.servers):  # nowhere else to go: wait before trying again
            await asyncio.sleep(self.retry_backoff_s * 2**attempt)
            for s in self.servers:
                s.down_until = 0.0

    def _saw(self, server: _Server, resp: GenerateResponse) -> None:
        meta = resp.meta_info
        if meta.finish_reason is not None and meta.finish_reason.type == "abort":
            server.known_version = None  # an update may be under way: the next response tells
        elif meta.weight_version is not None:
            server.known_version = max(server.known_version or 0, parse_version(meta.weight_version))

    def _segment(
        self, server: _Server, resp: GenerateResponse, sent_at: int | None
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

    # -- weight sync and control ------------------------------------------------------------------

    async def update_weights_from_disk(
        self,
        model_path: str,
        version: int,
        *,
        abort_all_requests: bool = True,
        flush_cache: bool = True,
        load_format: str | None = None,
    ) -> list[dict[str, Any]]:
        """Loads a Hugging Face checkpoint directory on every server and sets its weight version.

        With ``abort_all_requests`` (default) in-flight generations end with finish reason abort and
        ``generate`` resumes them on the new weights, so per-token versions stay exact.

        Raises:
            WeightUpdateFailed: some server failed; the message names each and why.
        """
        body: dict[str, Any] = {
            "model_path": model_path,
            "abort_all_requests": abort_all_requests,
            "weight_version": str(version),
            "flush_cache": flush_cache,
        }
        if load_format is not None:
            body["load_format"] = load_format
        results = await self._on_all("POST", "/update_weights_from_disk", body)
        self._raise_failed("weight update", results)
        for s in self.servers:
            s.known_version = version
        return results

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
        bodies = [
            {
                "master_address": master_address,
                "master_port": master_port,
                "rank_offset": offset,
                "world_size": world_size,
                "group_name": group_name,
                "backend": backend,
            }
            for offset in offsets
        ]
        results = await asyncio.gather(
            *(
                self._control(s, "POST", "/init_weights_update_group", b)
                for s, b in zip(self.servers, bodies, strict=True)
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
        body: dict[str, Any] = {
            "names": list(names),
            "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
            "shapes": [list(shape) for shape in shapes],
            "group_name": group_name,
            "weight_version": str(weight_version),
            "flush_cache": flush_cache,
            "abort_all_requests": abort_all_requests,
        }
        results = await self._on_all("POST", "/update_weights_from_distributed", body)
        self._raise_failed("weight update", results)
        for s in self.servers:
            s.known_version = weight_version
        return results

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        """Every server leaves the weights group ``group_name``."""
        results = await self._on_all("POST", "/destroy_weights_update_group", {"group_name": group_name})
        self._raise_failed("destroy_weights_update_group", results)

    def _raise_failed(self, what: str, results: list[Any]) -> None:
        """Raises WeightUpdateFailed naming each server whose answer was an error or ``success: false``."""
        failed = [
            f"{s.url}: {r}" if isinstance(r, BaseException) else f"{s.url}: {r.get('message')}"
            for s, r in zip(self.servers, results, strict=True)
            if isinstance(r, BaseException) or not r.get("success", False)
        ]
        if failed:
            raise WeightUpdateFailed(f"{what} failed on " + "; ".join(failed))

    async def get_weight_version(self) -> dict[str, int]:
        """The weight version of every server."""
        results = await self._on_all("GET", "/get_weight_version", None, raise_first=True)
        return {s.url: parse_version(r["weight_version"]) for s, r in zip(self.servers, results, strict=True)}

    async def pause_generation(self, mode: Literal["abort", "retract", "in_place"] = "abort") -> None:
        await self._on_all("POST", "/pause_generation", {"mode": mode}, raise_first=True)

    async def continue_generation(self) -> None:
        await self._on_all("POST", "/continue_generation", {}, raise_first=True)

    async def flush_cache(self) -> None:
        await self._on_all("GET", "/flush_cache", None, raise_first=True)

    async def health(self) -> dict[str, bool]:
        """Whether each server answers ``/health`` with 200."""

        async def one(s: _Server) -> bool:
            try:
                r = await self._http.get(f"{s.url}/health", timeout=self._ctl_timeout)
            except httpx.HTTPError:
                return False
            return r.status_code == 200

        return dict(
            zip((s.url for s in self.servers), await asyncio.gather(*map(one, self.servers)), strict=True)
        )

    async def wait_until_healthy(self, timeout_s: float = 120.0, poll_s: float = 0.5) -> None:
        """Waits until every server is healthy; raises EngineUnavailable after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = await self.health()
            if all(status.values()):
                return
            if time.monotonic() > deadline:
                down = [u for u, ok in status.items() if not ok]
                raise EngineUnavailable(f"engines not healthy after {timeout_s:g} s: {down}")
            await asyncio.sleep(poll_s)

    async def _on_all(
        self, method: str, path: str, body: dict[str, Any] | None, *, raise_first: bool = False
    ) -> list[Any]:
        results = await asyncio.gather(
            *(self._control(s, method, path, body) for s in self.servers), return_exceptions=True
        )
        if raise_first:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    async def _control(self, server: _Server, method: str, path: str, body: dict[str, Any] | None) -> Any:
        """A control call on one server; only connection failures (nothing sent) are retried."""
        url = f"{server.url}{path}"
        for attempt in range(self.connect_retries + 1):
            try:
                r = await self._http.request(method, url, json=body, timeout=self._ctl_timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                if attempt == self.connect_retries:
                    raise EngineUnavailable(f"{url}: {e}") from e
                await asyncio.sleep(self.retry_backoff_s * 2**attempt)
                continue
            except httpx.TransportError as e:
                raise EngineRequestFailed(f"{url}: {type(e).__name__}: {e}; not retried") from e
            if r.status_code >= 400:
                try:
                    payload = r.json()
                except ValueError:
                    payload = None
                if isinstance(payload, dict) and "success" in payload:
                    return payload  # SGLang reports a failed update as 400 + {"success": false, ...}
                raise EngineHTTPError(url, r.status_code, r.text)
            if r.headers.get("content-type", "").startswith("application/json"):
                return r.json()
            return {"message": r.text}  # SGLang answers some control calls in plain text
        raise AssertionError("unreachable")
