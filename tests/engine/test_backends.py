"""Which kind of engine a URL is, asked over real HTTP: the built-in engine (the real server, SGLang's
API), a server answering ``GET /version`` as vLLM does, and servers that are neither; the client
class each backend gets."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.backends import api_of, client_class, engine_backend, engine_client, served_api
from engine.client import EngineClient
from engine.vllm_client import VLLMClient
from pqrl.errors import UsageError
from pqrl.redis_server import free_port


@contextlib.contextmanager
def answering(routes: dict[str, tuple[int, object]]) -> Iterator[str]:
    """An HTTP server on a loopback port answering ``GET path`` with (status, JSON body); 404 else."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            status, body = routes.get(self.path, (404, {"detail": "Not Found"}))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


VLLM = {"/health": (200, {}), "/version": (200, {"version": "0.32.0"})}  # vLLM's /version answer


def test_each_backend_gets_the_client_of_its_api():
    assert client_class("vllm") is VLLMClient
    assert client_class("builtin") is EngineClient and client_class("sglang") is EngineClient
    assert (api_of("builtin"), api_of("sglang"), api_of("vllm")) == ("sglang", "sglang", "vllm")
    with pytest.raises(ValueError, match="unknown engine backend 'tgi'"):
        client_class("tgi")


async def test_the_built_in_engine_answers_as_sglang_and_a_vllm_server_as_vllm(served):
    url, _ = served
    with answering(VLLM) as vllm:
        assert await served_api(url) == "sglang"
        assert await served_api(vllm) == "vllm"
        assert await engine_backend([url]) == "sglang"
        assert await engine_backend(vllm, "auto") == "vllm"
        assert await engine_backend(url, "builtin") == "builtin"  # named and confirmed
        client = engine_client(vllm, await engine_backend(vllm))
        assert isinstance(client, VLLMClient)
        await client.aclose()


async def test_a_wrong_name_fails_with_one_line_saying_what_the_server_is(served):
    url, _ = served
    with pytest.raises(UsageError, match="answers as an SGLang-API server .*not as a vLLM server") as e:
        await engine_backend(url, "vllm")
    assert (e.value.fix or "").startswith("--backend builtin")
    with answering(VLLM) as vllm:
        for name in ("builtin", "sglang"):
            with pytest.raises(UsageError, match="answers as a vLLM server, not as an SGLang-API") as e:
                await engine_backend([vllm], name)
            assert (e.value.fix or "").startswith("--backend vllm")
        with pytest.raises(UsageError, match="engines of different kinds"):
            await engine_backend([vllm, url])


async def test_a_server_that_is_no_engine_or_wants_a_key_is_named_so():
    with answering({"/health": (200, {}), "/version": (200, "not json of vLLM")}) as other:
        neither = "not an engine: GET /version answered HTTP 200, GET /model_info HTTP 404"
        with pytest.raises(UsageError, match=neither):
            await served_api(other)
        with pytest.raises(UsageError, match="not an engine"):  # a name does not make it one
            await engine_backend(other, "vllm")
    locked = answering({"/model_info": (401, {"detail": "unauthorized"})})
    with locked as url, pytest.raises(UsageError, match="HTTP 401.*API key"):
        await engine_backend(url)


async def test_nothing_answering_is_unknown_unless_named():
    down = f"http://127.0.0.1:{free_port()}"
    assert await served_api(down) is None
    with pytest.raises(UsageError, match="no answer, so which engine it is"):
        await engine_backend(down)
    assert await engine_backend(down, "vllm") == "vllm"  # the caller waits for it to come up
    for bad in ("localhost:30000", "ftp://127.0.0.1:1", "http://[::1", "http://"):
        with pytest.raises(UsageError, match="not an engine URL"):
            await engine_backend(bad, "vllm")  # named or not: no engine can ever answer there


def test_a_proxy_before_an_engine_not_up_yet_is_no_answer_and_auto_waits_for_the_engine():
    import asyncio
    import time

    from launcher import engine_choice

    loading = {"/version": (503, {}), "/model_info": (502, {})}
    with answering(loading) as proxy:
        assert asyncio.run(served_api(proxy)) is None  # not "not an engine": it may come up
    routes: dict[str, tuple[int, object]] = dict(loading)
    with answering(routes) as url:
        threading.Timer(3.0, lambda: routes.update({"/version": (200, {"version": "0.32.0"})})).start()
        t0 = time.monotonic()
        client = asyncio.run(engine_choice.connect_engines(url, "auto", None, timeout_s=60))
        assert isinstance(client, VLLMClient) and time.monotonic() - t0 >= 2.5
        asyncio.run(client.aclose())
