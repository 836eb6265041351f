"""``pqrl search serve`` in a process of its own, asked over HTTP as Search-R1's clients ask it,
and the search environment with a retrieval server as its backend: the real one answers, a server
that stalls, fails or answers garbage gives the model a tool error and the episode goes on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from env_server.types import ToolCall, ToolStatus
from pqrl.redis_server import stop_process
from tasks.search import search_suite
from tests.servers import free_port, serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
SUITE = search_suite(30, seed=5)
DOCS = SUITE.manifest.defaults["corpus"]


def _healthy(url: str) -> bool:
    with contextlib.suppress(httpx.TransportError):
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    return False


@pytest.fixture(scope="module")
def retrieval_server(tmp_path_factory) -> Iterator[str]:
    """``pqrl search serve`` over the generated corpus written as a file; its base URL."""
    where = tmp_path_factory.mktemp("retrieval")
    corpus = where / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "search",
        "serve",
        "--corpus",
        str(corpus),
        "--port",
        str(port),
    ]
    env = {**os.environ, "PQRL_CACHE": str(where / "cache")}
    with open(where / "log", "w+") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while not _healthy(url):
                assert proc.poll() is None and time.monotonic() < deadline, (log.seek(0), log.read())[1]
                time.sleep(0.1)
            yield url
        finally:
            stop_process(proc)
    assert proc.returncode is not None


def test_serve_answers_search_r1_requests_with_its_shape_and_ranking(retrieval_server):
    health = httpx.get(retrieval_server + "/healthz").json()
    assert health["status"] == "ok" and health["documents"] == len(DOCS)
    city = next(d for d in DOCS if d["id"].startswith("city-"))
    queries = [city["title"], "zzqx", f"{city['title']} river"]
    r = httpx.post(
        retrieval_server + "/retrieve", json={"queries": queries, "topk": 3, "return_scores": True}
    )
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 3 and result[1] == [], "one list per query; nothing scores for unknown words"
    best = result[0][0]
    assert set(best) == {"document", "score"} and best["document"]["id"] == city["id"]
    assert best["document"]["contents"] == f'"{city["title"]}"\n{city["text"]}'
    scores = [e["score"] for e in result[0]]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores) and len(scores) <= 3
    plain = httpx.post(retrieval_server + "/retrieve", json={"queries": [city["title"]], "topk": 2}).json()
    assert plain["result"][0][0]["id"] == city["id"] and "score" not in plain["result"][0][0]
    # a request without topk gets the server's default (3); bounds are 422, not a crash
    assert (
        len(httpx.post(retrieval_server + "/retrieve", json={"queries": ["river"]}).json()["result"][0]) == 3
    )
    for bad in ({"queries": ["x"], "topk": 101}, {"queries": []}, {"queries": "x"}, {"topk": 3}):
        assert httpx.post(retrieval_server + "/retrieve", json=bad).status_code == 422, bad
    assert httpx.post(retrieval_server + "/retrieve", content=b"x" * (9 << 20)).status_code == 413


def test_serve_on_a_taken_port_is_one_line_and_exit_2(retrieval_server, tmp_path):
    port = retrieval_server.rsplit(":", 1)[1]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "some words"}\n')
    cmd = [sys.executable, "-m", "launcher.cli", "search", "serve", "--corpus", str(corpus), "--port", port]
    env = {**os.environ, "PQRL_CACHE": str(tmp_path / "cache")}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"port {port} on 127.0.0.1 is in use" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "cache").exists()  # refused before any indexing


async def test_search_env_with_a_retrieval_server_finds_and_scores(client, retrieval_server):
    task = next(t for t in SUITE.tasks if t.hops == 1)
    for url in (retrieval_server, retrieval_server + "/retrieve"):
        kwargs = {"retriever_url": url, "format_reward": 0.2}
        s = await client.create_session("search-v1", task.model_dump(), env_kwargs=kwargs)
        call = ToolCall(name="search", arguments={"query": task.question, "k": 3})
        out = (await client.step(s.session_id, [call])).messages[0]
        assert (
            out.status is ToolStatus.OK and task.answers[0] in out.content and out.content.startswith("[1] ")
        )
        await client.step(s.session_id, [ToolCall(name="answer", arguments={"text": "Nowhere Atall"})])
        result = await client.evaluate(s.session_id)
        assert result.info["found"] and result.reward == pytest.approx(0.1), (
            "the evidence credit still applies"
        )


def _misbehaving() -> FastAPI:
    app = FastAPI()

    @app.post("/slow/retrieve")
    async def slow() -> dict:
        await asyncio.sleep(3)
        return {"result": [[]]}

    @app.post("/trickle/retrieve")
    async def trickle() -> Response:
        async def drip() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b" "
                await asyncio.sleep(0.3)

        return StreamingResponse(drip(), media_type="application/json")

    @app.post("/fail/retrieve")
    async def fail() -> Response:
        return PlainTextResponse("index not loaded", status_code=500)

    @app.post("/html/retrieve")
    async def html() -> Response:
        return PlainTextResponse("<html>proxy error</html>")

    @app.post("/shape/retrieve")
    async def shape(request: Request) -> Response:
        return JSONResponse({"result": [[{"document": {"id": 1}, "score": 1.0}]]})

    @app.post("/score/retrieve")
    async def score() -> Response:
        return Response('{"result": [[{"document": {"contents": "x"}, "score": NaN}]]}')

    @app.post("/huge/retrieve")
    async def huge() -> Response:
        return PlainTextResponse("x" * (9 << 20))

    return app


@pytest.fixture(scope="module")
def bad_server() -> Iterator[str]:
    with serve_in_thread(_misbehaving()) as url:
        yield url


@pytest.mark.parametrize(
    ("path", "says"),
    [("slow", "did not answer within 1s"), ("trickle", "did not answer within 1s"),
     ("fail", "answered HTTP 500: index not loaded"),
     ("html", "not JSON"), ("shape", "result[0][0] has no text"), ("score", "score is not a finite number"),
     ("huge", "exceeds 8 MiB"), ("gone", "HTTP 404")],
)  # fmt: skip
async def test_a_failing_retriever_is_a_tool_error_and_the_episode_goes_on(client, bad_server, path, says):
    task = SUITE.tasks[0]
    kwargs = {"retriever_url": f"{bad_server}/{path}", "retriever_timeout": 1}
    s = await client.create_session("search-v1", task.model_dump(), env_kwargs=kwargs)
    out = (await client.step(s.session_id, [ToolCall(name="search", arguments={"query": "river"})])).messages[
        0
    ]
    assert out.status is ToolStatus.ERROR and says in out.content, out.content
    assert out.content.startswith("Error: search failed: RetrieverError: ")
    done = await client.step(s.session_id, [ToolCall(name="answer", arguments={"text": task.answers[0]})])
    assert done.done and (await client.evaluate(s.session_id)).reward == 1.0


async def test_an_unreachable_retriever_and_bad_settings(client):
    task = SUITE.tasks[0]
    s = await client.create_session(
        "search-v1", task.model_dump(), env_kwargs={"retriever_url": f"http://127.0.0.1:{free_port()}"}
    )
    out = (await client.step(s.session_id, [ToolCall(name="search", arguments={"query": "river"})])).messages[
        0
    ]
    assert out.status is ToolStatus.ERROR and "unreachable: ConnectError" in out.content
    for bad in ({"retriever_url": "ftp://x"}, {"retriever_url": "http://"}, {"retriever_url": "http://[::1"},
                {"retriever_url": "http://x", "retriever_timeout": 0},
                {"retriever_topk": 11}, {"retriever_topk": True}):  # fmt: skip
        with pytest.raises(Exception, match="retriever_"):
            await client.create_session("search-v1", task.model_dump(), env_kwargs=bad)
