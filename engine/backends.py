"""Which client speaks to an engine, by the backend's name; and which kind of server an engine URL is,
by what it answers.

SGLang and the built-in engine speak SGLang's native API (``EngineClient``); vLLM speaks its own
(``VLLMClient``). Sent to the wrong kind, every request fails with 404s mid-run, so a URL's kind is
asked first: vLLM answers ``GET /version`` with ``{"version": ...}``, SGLang and the built-in engine
answer ``GET /model_info`` with ``{"model_path": ...}`` (neither has ``/version``). A named backend the
server contradicts, or a server that answers as neither, fails with one line saying which it is.

Imports what the clients import (the standard library, httpx, pydantic) and the project floor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

import httpx

from engine.client import EngineClient
from engine.vllm_client import VLLMClient
from pqrl.errors import UsageError

__all__ = [
    "BACKENDS",
    "Api",
    "api_of",
    "checked_urls",
    "client_class",
    "engine_backend",
    "engine_client",
    "served_api",
]

BACKENDS = ("builtin", "sglang", "vllm")
Api = Literal["sglang", "vllm"]  # what a server speaks: the built-in engine speaks SGLang's API

_NAMES = {"sglang": "an SGLang-API server (SGLang or the built-in engine)", "vllm": "a vLLM server"}


def api_of(backend: str) -> Api:
    """The API a backend's servers speak."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown engine backend {backend!r}: one of {list(BACKENDS)}")
    return "vllm" if backend == "vllm" else "sglang"


def client_class(backend: str) -> type[EngineClient]:
    """The client class of a backend's servers."""
    return VLLMClient if api_of(backend) == "vllm" else EngineClient


def engine_client(urls: str | Sequence[str], backend: str, **options: Any) -> EngineClient:
    """A client of the engines at ``urls``, all of kind ``backend`` (options: ``EngineClient``'s)."""
    return client_class(backend)(urls, **options)


def _json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


def checked_urls(urls: str | Sequence[str]) -> list[str]:
    """``urls`` as a list, each an http(s) URL with a host; ``UsageError`` naming the first that is
    not (no engine can ever answer there: better said at once than after a wait for its health)."""
    urls = [urls] if isinstance(urls, str) else list(urls)
    if not urls:
        raise UsageError("no engine URL given")
    for url in urls:
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as e:
            raise UsageError(f"{url}: not an engine URL: {e}", fix="give http://HOST:PORT") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise UsageError(f"{url}: not an engine URL (no http:// or https:// and host)",
                             fix="give http://HOST:PORT")  # fmt: skip
    return urls


async def served_api(url: str, *, api_key: str | None = None, timeout_s: float = 10.0) -> Api | None:
    """The API the server at ``url`` speaks, by what it answers; None when nothing answered (down,
    or not up yet, or only a proxy's 5xx). ``UsageError`` when it answered, but as neither kind."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = url.rstrip("/")
    async with httpx.AsyncClient(headers=headers, timeout=timeout_s) as http:
        try:
            version = await http.get(f"{base}/version")
            info = await http.get(f"{base}/model_info")
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as e:
            raise UsageError(f"{url}: not an engine URL: {e}", fix="give http://HOST:PORT") from None
        except httpx.TransportError:
            return None
    answer, model = _json(version), _json(info)
    if version.status_code >= 500 and info.status_code >= 500:  # a proxy before an engine not up yet
        return None
    if version.status_code == 200 and isinstance(answer, dict) and isinstance(answer.get("version"), str):
        return "vllm"
    if info.status_code == 200 and isinstance(model, dict) and "model_path" in model:
        return "sglang"
    if info.status_code in (401, 403):
        raise UsageError(
            f"{url}: the engine refused the request (HTTP {info.status_code}): it takes an API key",
            fix="pqrl's engine clients send no key: serve the engine without one, on a private network",
        )
    raise UsageError(
        f"{url}: not an engine: GET /version answered HTTP {version.status_code}, GET /model_info HTTP "
        f"{info.status_code} (a vLLM server answers the first, SGLang and the built-in engine the second)",
        fix="check the URL",
    )


async def engine_backend(
    urls: str | Sequence[str], backend: str = "auto", *, named_by: str = "--backend", **probe: Any
) -> str:
    """The backend of the engines at ``urls``: ``backend`` when named (checked against each engine
    that answers), or the kind every engine answers as (``"auto"``: ``"vllm"`` or ``"sglang"``).
    ``named_by``: where the user names it (``--backend``, ``services.engine:``), for the fix.

    Raises:
        UsageError: an engine answers as another kind than the one named; ``auto`` and an engine that
            does not answer, or engines of different kinds; an answer of neither kind.
    """
    urls = checked_urls(urls)
    named = None if backend == "auto" else api_of(backend)
    apis = await asyncio.gather(*(served_api(u, **probe) for u in urls))
    for url, api in zip(urls, apis, strict=True):
        if named is not None and api is not None and api != named:
            right = "vllm" if api == "vllm" else "builtin"
            raise UsageError(
                f"{url} answers as {_NAMES[api]}, not as {_NAMES[named]} ({backend!r} was named)",
                fix=f"{named_by} {right}, or the URL of a {backend} engine",
            )
    if named is not None:
        return backend
    if None in apis:
        down = urls[apis.index(None)]
        raise UsageError(
            f"{down}: no answer, so which engine it is (vLLM or SGLang API) is unknown",
            fix=f"start the engine first, or name its kind ({named_by} builtin, sglang or vllm)",
        )
    if len(set(apis)) > 1:
        kinds = ", ".join(f"{u}: {a}" for u, a in zip(urls, apis, strict=True))
        raise UsageError(
            f"engines of different kinds in one client ({kinds})", fix="give engines of one kind"
        )
    return str(apis[0])
