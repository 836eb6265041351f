"""The engine client over real loopback HTTP against scripted SGLang-API servers: least-loaded choice,
stickiness, retries only before sending, abort-resume with per-token versions, weight-sync helpers.
(The client against the real built-in engine: tests/engine/test_weights.py.)"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse

from engine.client import (
    EngineClient,
    EngineError,
    EngineHTTPError,
    EngineRequestFailed,
    EngineUnavailable,
    SamplingParams,
    WeightUpdateFailed,
)
from tests.servers import free_port, serve_in_thread


def _answer(body: dict[str, Any], ids: list[int], version: str, finish: dict[str, Any]) -> dict[str, Any]:
    return {
        "text": "".join(chr(97 + i % 26) for i in ids),
        "output_ids": ids,
        "meta_info": {
            "id": body.get("rid", ""),
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(ids),
            "weight_version": version,
            "output_token_logprobs": [[-0.1 * (i + 1), t, None] for i, t in enumerate(ids)],
        },
    }


class FakeEngine:
    """An SGLang-API server that records requests, can hold them (``gate``), and answers from a script."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.control: list[tuple[str, Any]] = []
        self.script: list[Any] = []  # answers (dicts) or (status, body) error tuples, in order
        self.gate = threading.Event()
        self.gate.set()
        self.version = "0"
        self.fail_update = False

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/generate")
        async def generate(body: dict[str, Any] = Body(...)) -> Any:  # noqa: B008
            self.requests.append(body)
            await asyncio.to_thread(self.gate.wait, 30)
            if self.script:
                item = self.script.pop(0)
                return JSONResponse(item[1], status_code=item[0]) if isinstance(item, tuple) else item
            n = min(2, body["sampling_params"]["max_new_tokens"])
            return _answer(body, [7] * n, self.version, {"type": "length", "length": n})

        @app.post("/update_weights_from_disk")
        async def update(body: dict[str, Any] = Body(...)) -> Any:  # noqa: B008
            self.control.append(("update", body))
            if self.fail_update:
                return JSONResponse({"success": False, "message": "disk on fire"}, status_code=400)
            self.version = body["weight_version"]
            return {"success": True, "message": "ok", "num_paused_requests": 0}

        @app.get("/model_info")
        async def version() -> Any:
            return {"weight_version": self.version}

        @app.get("/health")
        async def health() -> Any:
            return {}

        @app.post("/pause_generation")
        async def pause(body: dict[str, Any] = Body(...)) -> Any:  # noqa: B008
            self.control.append(("pause", body["mode"]))
            return {"success": True}

        @app.post("/continue_generation")
        async def resume() -> Any:
            self.control.append(("continue", None))
            return {"success": True}

        @app.get("/flush_cache")
        async def flush() -> Any:
            self.control.append(("flush", None))
            return JSONResponse("Cache flushed.")

        @app.post("/abort_request")
        async def abort(body: dict[str, Any] = Body(...)) -> Any:  # noqa: B008
            self.control.append(("abort", body["rid"]))
            return {}

        return app


@pytest.fixture
def two_fakes() -> Iterator[tuple[FakeEngine, str, FakeEngine, str]]:
    a, b = FakeEngine(), FakeEngine()
    with serve_in_thread(a.app()) as url_a, serve_in_thread(b.app()) as url_b:
        yield a, url_a, b, url_b
        a.gate.set()
        b.gate.set()


async def _until(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


PARAMS = SamplingParams(temperature=0, max_new_tokens=4)


async def test_least_loaded_choice_and_stickiness_per_rollout(two_fakes):
    a, url_a, b, url_b = two_fakes
    async with EngineClient([url_a, url_b]) as client:
        # Idle servers: ties go to the one picked least recently, so load spreads.
        for _ in range(4):
            await client.generate([1, 2], PARAMS)
        assert (len(a.requests), len(b.requests)) == (2, 2)

        a.gate.clear()  # A holds what it gets
        held = asyncio.create_task(client.generate([1], PARAMS, rollout_id="r-a"))
        await _until(lambda: len(a.requests) == 3)
        assert client.in_flight == {url_a: 1, url_b: 0}
        for _ in range(3):
            await client.generate([1], PARAMS)  # least loaded: B
        assert len(b.requests) == 5

        # The rollout stays on its server, however loaded.
        sticky = asyncio.create_task(client.generate([1, 9], PARAMS, rollout_id="r-a"))
        await _until(lambda: len(a.requests) == 4)
        assert client.in_flight == {url_a: 2, url_b: 0}
        a.gate.set()
        g1, g2 = await asyncio.gather(held, sticky)
        assert g1.server == g2.server == url_a
        assert client.in_flight == {url_a: 0, url_b: 0}
        client.release("r-a")
        assert (await client.generate([1], PARAMS, rollout_id="r-a")).server in (url_a, url_b)


async def test_connection_refused_is_retried_on_another_server(two_fakes):
    _, _, b, url_b = two_fakes
    dead = f"http://127.0.0.1:{free_port()}"
    async with EngineClient([dead, url_b], retry_backoff_s=0.01) as client:
        g = await client.generate([1, 2, 3], PARAMS)
        assert g.server == url_b and len(b.requests) == 1
    async with EngineClient([dead], connect_retries=1, retry_backoff_s=0.01) as client:
        with pytest.raises(EngineUnavailable, match="no engine accepted a connection"):
            await client.generate([1], PARAMS)


class DroppingServer:
    """Reads a whole HTTP request, then closes the connection without answering."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                while len(body) < length:
                    body += conn.recv(65536)
                self.received += 1


async def test_a_generate_that_may_have_run_is_never_sent_again(two_fakes):
    _, _, b, url_b = two_fakes
    dropping = DroppingServer()
    try:
        async with EngineClient([dropping.url, url_b]) as client:
            with pytest.raises(EngineRequestFailed, match="not retried: the request may have run"):
                await client.generate([1, 2], PARAMS)
        assert dropping.received == 1 and b.requests == []
    finally:
        dropping.sock.close()


async def test_aborted_generation_is_resumed_and_tokens_keep_their_versions(two_fakes):
    a, url_a, _, _ = two_fakes
    first = {"input_ids": [1, 2, 3]}
    a.script = [
        _answer(first, [5, 6], "0", {"type": "abort", "message": "weight update"}),
        _answer({"input_ids": [1, 2, 3, 5, 6]}, [7, 8, 9], "1", {"type": "length", "length": 3}),
    ]
    async with EngineClient([url_a]) as client:
        g = await client.generate(
            [1, 2, 3], SamplingParams(temperature=1.0, max_new_tokens=5, sampling_seed=4)
        )
    resend = a.requests[1]
    assert resend["input_ids"] == [1, 2, 3, 5, 6] and resend["sampling_params"]["max_new_tokens"] == 3
    assert resend["sampling_params"]["sampling_seed"] == 4 and resend["return_logprob"] is True
    assert g.output_ids == [5, 6, 7, 8, 9] and g.versions == [0, 0, 1, 1, 1]
    assert g.logprobs == pytest.approx([-0.1, -0.2, -0.1, -0.2, -0.3])
    assert g.finish_reason.type == "length" and g.finish_reason.length == 5
    assert g.segments == 2 and g.prompt_tokens == 3 and g.text == "fghij"


async def test_a_generation_the_caller_aborted_is_not_resumed(two_fakes):
    a, url_a, _, _ = two_fakes
    a.gate.clear()
    a.script = [_answer({"input_ids": [1]}, [4], "0", {"type": "abort", "message": "aborted"})]
    async with EngineClient([url_a]) as client:
        task = asyncio.create_task(client.generate([1], PARAMS, rid="x"))
        await _until(lambda: len(a.requests) == 1)
        await client.abort("x")
        a.gate.set()
        g = await task
    assert ("abort", "x") in a.control and g.finish_reason.type == "abort" and len(a.requests) == 1


async def test_lower_bound_versions_for_engines_paused_in_place(two_fakes):
    a, url_a, _, _ = two_fakes
    async with EngineClient([url_a], versions_from="lower_bound") as client:
        a.version = "2"
        assert (await client.generate([1], PARAMS)).versions == [2, 2]
        a.version = "3"  # changed while this client was not looking: may have been mid-generation
        assert (await client.generate([1], PARAMS)).versions == [2, 2]
        assert (await client.generate([1], PARAMS)).versions == [3, 3]
    async with EngineClient([url_a]) as client:  # default: the response's version
        assert (await client.generate([1], PARAMS)).versions == [3, 3]


async def test_errors_are_clear(two_fakes):
    a, url_a, _, _ = two_fakes
    a.script = [
        (400, {"error": "invalid_request", "detail": "token ids must be in [0, 49152)"}),
        {
            "text": "",
            "output_ids": [3],
            "meta_info": {"weight_version": "0", "finish_reason": {"type": "length"}},
        },
        _answer({"input_ids": [1]}, [3], "v7", {"type": "length", "length": 1}),
    ]
    async with EngineClient([url_a]) as client:
        with pytest.raises(EngineHTTPError, match="HTTP 400.*token ids must be") as err:
            await client.generate([99999], PARAMS)
        assert err.value.status == 400
        with pytest.raises(EngineError, match="no logprob per output token"):
            await client.generate([1], PARAMS)
        with pytest.raises(EngineError, match="--weight-version"):
            await client.generate([1], PARAMS)
    with pytest.raises(ValueError, match="at least one server"):
        EngineClient([])


async def test_weight_sync_helpers_reach_every_server(two_fakes):
    a, url_a, b, url_b = two_fakes
    async with EngineClient([url_a, url_b]) as client:
        await client.update_weights_from_disk("/ckpt/step5", 5)
        assert await client.get_weight_version() == {url_a: 5, url_b: 5}
        body = a.control[-1][1]
        assert (
            body["weight_version"] == "5"
            and body["abort_all_requests"] is True
            and body["model_path"] == "/ckpt/step5"
        )
        await client.pause_generation("retract")
        await client.continue_generation()
        await client.flush_cache()
        for fake in (a, b):
            assert [c[0] for c in fake.control[-3:]] == ["pause", "continue", "flush"]
        assert await client.health() == {url_a: True, url_b: True}
        await client.wait_until_healthy(timeout_s=5)

        b.fail_update = True
        with pytest.raises(WeightUpdateFailed, match=f"{url_b}: disk on fire"):
            await client.update_weights_from_disk("/ckpt/step6", 6)
    async with EngineClient([url_a, f"http://127.0.0.1:{free_port()}"], connect_retries=0) as client:
        health = await client.health()
        assert list(health.values()) == [True, False]
        with pytest.raises(EngineUnavailable, match="not healthy"):
            await client.wait_until_healthy(timeout_s=0.2, poll_s=0.05)


def test_the_client_is_a_floor_module():
    code = (
        "import sys\n"
        "for name in ['torch', 'transformers', 'fastapi', 'uvicorn', 'redis', 'agent_loop', 'trainer']:\n"
        "    sys.modules[name] = None\n"
        "import engine.client\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
