"""The env server over real HTTP (uvicorn on loopback) with HttpEnvClient and raw httpx, and the
in-process LocalEnvClient behind the same interface: episodes, auth, bad inputs, metrics and load.
Failing environments, retries and idempotency are in test_http_recovery.py, sandbox failures in
test_http_sandboxes.py."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from env_server.builtin import EchoEnv
from env_server.client import AuthError, HttpEnvClient, LocalEnvClient
from env_server.registry import register_environment, registry
from env_server.sessions import (
    InvalidRequest,
    NotFound,
    SessionDone,
    SessionManager,
    TooManySessions,
)
from env_server.types import SessionInfo, ToolStatus
from tests.env_server.conftest import (
    ECHO_TASK,
    NO_SESSION,
    RUN_LABEL,
    TOKEN,
    LiveServer,
    call,
    echo_episode,
    error_of,
    serve_in_subprocess,
)

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- episodes


async def test_full_episode_over_http(client, server):
    info, (first, last), reward = await echo_episode(client)
    assert info.env_id == "echo-v1" and len(info.session_id) == 32
    assert info.observation.messages[0].content == "Say 42."
    assert info.observation.tools == EchoEnv.tool_schemas()
    assert first.messages[0].model_dump() == {
        "role": "tool",
        "content": "hi",
        "name": "echo",
        "tool_call_id": "c1",
        "status": "ok",
        "tool_calls": None,
    }
    assert not first.done
    assert last.messages[0].content == "submitted" and last.done
    assert reward.reward == 1.0 and reward.info == {"answer": "42"}
    assert server.healthz() == {"ok": True, "sessions": 0}, "close did not end the session"


async def test_tool_status_crosses_the_wire_as_its_string(raw, client):
    info = await client.create_session("echo-v1", ECHO_TASK, seed=0)
    r = await raw.post(
        f"/sessions/{info.session_id}/step", json={"tool_calls": [{"name": "nope", "id": "x"}]}
    )
    assert r.status_code == 200 and r.json()["messages"][0]["status"] == "invalid", r.text
    step = await client.step(info.session_id, [call("echo", "c1", text="hi"), call("nope", "c2")])
    assert [m.status for m in step.messages] == [ToolStatus.OK, ToolStatus.INVALID]
    assert all(type(m.status) is ToolStatus for m in step.messages)
    await client.close_session(info.session_id)


async def test_local_and_http_clients_behave_the_same(client):
    local = LocalEnvClient(SessionManager(pool_size=0, run=RUN_LABEL))
    try:
        for answer in ("42", "41"):
            h_info, h_steps, h_reward = await echo_episode(client, answer)
            l_info, l_steps, l_reward = await echo_episode(local, answer)
            assert h_info.observation == l_info.observation
            assert h_steps == l_steps
            assert h_reward == l_reward
        assert await client.environments() == await local.environments()
        for c in (client, local):
            with pytest.raises(NotFound):
                await c.evaluate(NO_SESSION)
    finally:
        await local.aclose()


async def test_environments_lists_tools(raw):
    r = await raw.get("/environments")
    assert r.status_code == 200
    by_id = {e["id"]: e for e in r.json()}
    assert by_id["echo-v1"] == {
        "id": "echo-v1",
        "needs_sandbox": False,
        "tools": EchoEnv.tool_schemas(),
        "max_turns": 8,
    }
    assert by_id["shell-v1"]["needs_sandbox"] is True
    assert set(by_id) == set(registry())


# ---------------------------------------------------------------- auth


def protected_routes(server: LiveServer) -> list[tuple[str, str]]:
    """Every (method, path) of the app's own schema but the probes, with a made-up session id."""
    routes = [
        (method.upper(), path.replace("{session_id}", NO_SESSION))
        for path, operations in server.app.openapi()["paths"].items()
        if path not in ("/healthz", "/readyz")
        for method in operations
    ]
    assert len(routes) == 6, f"unexpected route set {routes}"
    return routes


async def test_every_route_but_healthz_needs_the_token(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as c:
        for method, path in protected_routes(server):
            body = {"json": {}} if method == "POST" else {}
            r = await c.request(method, path, **body)
            assert r.status_code == 401, f"{method} {path} without a token: {r.status_code} {r.text}"
            assert r.headers.get("www-authenticate") == "Bearer", f"{method} {path}: {r.headers}"
            assert error_of(r)[1] == "unauthorized"
            r = await c.request(method, path, headers={"Authorization": "Bearer wrong"}, **body)
            assert r.status_code == 403, f"{method} {path} with a wrong token: {r.status_code} {r.text}"
            assert error_of(r) == (403, "unauthorized", "invalid token")
            r = await c.request(method, path, headers={"Authorization": f"Basic {TOKEN}"}, **body)
            assert r.status_code == 401, f"{method} {path} with a non-bearer scheme: {r.status_code}"
        r = await c.get("/healthz")
        assert r.status_code == 200 and r.json() == {"ok": True, "sessions": 0}
        for hidden in ("/openapi.json", "/docs", "/redoc"):
            assert (await c.get(hidden)).status_code == 401, f"{hidden} answers without a token"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for html in ("/docs", "/redoc"):
            assert (await c.get(html, headers=auth)).status_code == 404, f"{html} is served"
        spec = await c.get("/openapi.json", headers=auth)
        assert spec.status_code == 200 and set(spec.json()["paths"]) >= {
            "/sessions",
            "/sessions/{session_id}/step",
        }


async def test_http_client_with_a_wrong_token_raises_auth_error(server):
    c = HttpEnvClient(server.url, token="wrong", retries=0)
    try:
        with pytest.raises(AuthError, match="403"):
            await c.environments()
    finally:
        await c.aclose()


async def test_malformed_body_without_token_is_401(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as c:
        r = await c.post("/sessions", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 401, f"{r.status_code} {r.text}"


# ---------------------------------------------------------------- bad inputs


async def test_unknown_environment_is_404_listing_the_registered(raw, client):
    status, code, detail = error_of(await raw.post("/sessions", json={"env_id": "nope-v1"}))
    assert (status, code) == (404, "unknown_environment")
    assert detail.startswith("unknown environment 'nope-v1'; registered: ") and "echo-v1" in detail, detail
    with pytest.raises(NotFound, match="registered: .*echo-v1"):
        await client.create_session("nope-v1", {})


async def test_unknown_session_is_404_on_every_session_route(raw):
    for method, path, body in [
        ("POST", f"/sessions/{NO_SESSION}/step", {"tool_calls": []}),
        ("POST", f"/sessions/{NO_SESSION}/evaluate", None),
        ("DELETE", f"/sessions/{NO_SESSION}", None),
    ]:
        status, code, detail = error_of(await raw.request(method, path, json=body))
        assert (status, code) == (404, "not_found"), f"{method} {path}"
        assert f"no session {NO_SESSION}" in detail, detail


async def test_step_after_done_is_409(raw, client):
    info = await client.create_session("echo-v1", ECHO_TASK)
    await client.step(info.session_id, [call("submit", answer="42")])
    status, code, detail = error_of(
        await raw.post(f"/sessions/{info.session_id}/step", json={"tool_calls": [{"name": "echo"}]})
    )
    assert (status, code) == (409, "session_done") and "is done" in detail, detail
    with pytest.raises(SessionDone):
        await client.step(info.session_id, [call("echo", text="again")])
    assert (await client.evaluate(info.session_id)).reward == 1.0, "evaluate still works after done"
    await client.close_session(info.session_id)


async def test_turn_limit_over_http_ends_with_truncated(client):
    info = await client.create_session("pytest-counter-v1", {})
    results = [await client.step(info.session_id, [call("incr")]) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info == {"truncated": "turn_limit"}
    with pytest.raises(SessionDone):
        await client.step(info.session_id, [call("incr")])


async def test_body_over_the_limit_is_413(limited_server):
    sid_body = {"env_id": "echo-v1", "task": {"prompt": "x" * 5000}}
    async with httpx.AsyncClient(base_url=limited_server.url, headers=limited_server.auth, timeout=10) as c:
        r = await c.post("/sessions", json=sid_body)
        assert error_of(r) == (413, "body_too_large", "request body exceeds 4096 bytes")

        async def chunks():
            yield b'{"env_id": "echo-v1", "task": {"prompt": "'
            for _ in range(5):
                yield b"y" * 1000
            yield b'"}}'

        r = await c.post("/sessions", content=chunks(), headers={"content-type": "application/json"})
        assert (
            "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
        )
        assert error_of(r) == (413, "body_too_large", "request body exceeds 4096 bytes")

        async def small_chunks():
            yield b'{"env_id": "echo-v1", "task": {"prompt": "'
            yield b"z" * 3000
            yield b'"}}'

        r = await c.post("/sessions", content=small_chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 201, f"a chunked body under the limit was refused: {r.status_code} {r.text}"
        assert r.json()["observation"]["messages"][0]["content"] == "z" * 3000
        await c.delete(f"/sessions/{r.json()['session_id']}")
    assert limited_server.healthz()["sessions"] == 0, "a refused body created a session"


@pytest.mark.parametrize(
    ("method", "path", "content"),
    [("POST", "/sessions", b'{"env_id": "\xff"}'), ("GET", "/nowhere", None), ("PUT", "/sessions", None)],
)
async def test_framework_errors_use_the_error_format(raw, method, path, content):
    r = await raw.request(method, path, content=content, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.status_code
    assert set(r.json()) == {"error", "detail"}, r.json()


async def test_malformed_json_is_422(raw):
    status, code, detail = error_of(
        await raw.post("/sessions", content=b'{"env_id": ', headers={"content-type": "application/json"})
    )
    assert (status, code) == (422, "invalid_request") and "JSON decode error" in detail, detail


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/sessions", {}, "body.env_id: Field required"),
        ("/sessions", {"env_id": "echo-v1", "tsak": {}}, "body.tsak: Extra inputs are not permitted"),
        ("/sessions", {"env_id": ""}, "body.env_id: String should have at least 1 character"),
        ("/sessions", {"env_id": "echo-v1", "seed": "x"}, "body.seed: Input should be a valid integer"),
        ("/sessions", {"env_id": "echo-v1", "task": []}, "body.task: Input should be a valid dictionary"),
        ("/sessions/{sid}/step", {}, "body.tool_calls: Field required"),
        ("/sessions/{sid}/step", {"tool_calls": [{"name": "echo", "args": {}}]},
         "body.tool_calls.0.args: Extra inputs are not permitted"),
        ("/sessions/{sid}/step", {"tool_calls": [{"arguments": {}}]},
         "body.tool_calls.0.name: Field required"),
        ("/sessions/{sid}/step", {"tool_calls": [{"name": "echo"}] * 65},
         "body.tool_calls: List should have at most 64 items"),
        ("/sessions/{sid}/step", {"tool_calls": [], "request_id": "r" * 129},
         "body.request_id: String should have at most 128 characters"),
    ],
)  # fmt: skip
async def test_missing_extra_and_wrong_fields_are_422_naming_the_field(raw, client, path, body, says):
    info = await client.create_session("echo-v1", ECHO_TASK)
    r = await raw.post(path.format(sid=info.session_id), json=body)
    status, code, detail = error_of(r)
    assert (status, code) == (422, "invalid_request") and says in detail, detail
    step = await client.step(info.session_id, [call("echo", text="still fine")])
    assert step.messages[0].content == "still fine", "a refused request changed the session"


async def test_session_limit_is_429_with_retry_after(limited_server):
    c = HttpEnvClient(limited_server.url, token=limited_server.token, retries=0)
    try:
        first = await c.create_session("echo-v1", {})
        await c.create_session("echo-v1", {})
        async with httpx.AsyncClient(base_url=limited_server.url, headers=limited_server.auth) as raw:
            r = await raw.post("/sessions", json={"env_id": "echo-v1"})
        status, code, detail = error_of(r)
        assert (status, code) == (429, "too_many_sessions") and "2 sessions are open" in detail, detail
        assert r.headers.get("retry-after") == "1"
        with pytest.raises(TooManySessions) as e:
            await c.create_session("echo-v1", {})
        assert e.value.retry_after == 1.0
        await c.close_session(first.session_id)
        again = await c.create_session("echo-v1", {})
        assert again.session_id and limited_server.healthz()["sessions"] == 2
    finally:
        await c.aclose()


async def test_a_task_the_environment_rejects_is_422(raw, client):
    status, code, detail = error_of(await raw.post("/sessions", json={"env_id": "pytest-strict-task-v1"}))
    assert (status, code) == (422, "bad_task")
    assert detail == "pytest-strict-task-v1 rejected the task: KeyError: 'answer'", detail
    with pytest.raises(InvalidRequest, match="ValueError: answer must be a string, got int"):
        await client.create_session("pytest-strict-task-v1", {"answer": 3})
    ok = await client.create_session("pytest-strict-task-v1", {"answer": "yes"})
    assert ok.observation.messages[0].content == "Guess."
    await client.close_session(ok.session_id)


async def test_env_kwargs_configure_the_environment(raw, client):
    info = await client.create_session("pytest-counter-v1", {}, env_kwargs={"start": 5})
    assert (await client.step(info.session_id, [call("incr")])).messages[0].content == "6"
    status, code, detail = error_of(
        await raw.post("/sessions", json={"env_id": "pytest-counter-v1", "env_kwargs": {"bogus": 1}})
    )
    assert (status, code) == (422, "bad_task"), detail
    assert detail.startswith("pytest-counter-v1 rejected its env_kwargs:") and "'bogus'" in detail, detail
    local = LocalEnvClient(SessionManager(pool_size=0, run=RUN_LABEL))
    try:
        with pytest.raises(InvalidRequest, match="rejected its env_kwargs"):
            await local.create_session("pytest-counter-v1", {}, env_kwargs={"bogus": 1})
    finally:
        await local.aclose()


async def test_lone_surrogate_in_a_task_does_not_500_or_leak(raw, server):
    body = b'{"env_id": "echo-v1", "task": {"prompt": "\\ud800"}}'
    r = await raw.post("/sessions", content=body, headers={"content-type": "application/json"})
    assert r.status_code < 500, f"{r.status_code} {r.text}"
    assert server.healthz()["sessions"] == (1 if r.status_code == 201 else 0)


async def test_a_broken_entry_point_gives_a_typed_error(raw, restore_registry):
    register_environment("pytest-broken-entry-v1", "tests.env_server.no_such_module_xyz:Env")
    r = await raw.post("/sessions", json={"env_id": "pytest-broken-entry-v1"})
    status, code, detail = error_of(r)
    assert "no_such_module_xyz" in detail


# ---------------------------------------------------------------- metrics


async def test_metrics_are_prometheus_text(raw, client):
    info = await client.create_session("echo-v1", ECHO_TASK)
    await client.step(info.session_id, [call("echo", text="x")])
    assert (await raw.post(f"/sessions/{NO_SESSION}/evaluate")).status_code == 404
    r = await raw.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for line in (
        "# TYPE pqrl_env_sessions_live gauge",
        "pqrl_env_sessions_live 1.0",
        "# TYPE pqrl_env_step_seconds histogram",
        'pqrl_env_step_seconds_count{env="echo-v1"} 1.0',
        "# TYPE pqrl_env_errors_total counter",
        'pqrl_env_errors_total{kind="not_found"} 1.0',
    ):
        assert line in text.splitlines(), f"{line!r} missing from /metrics:\n{text}"


# ---------------------------------------------------------------- load


async def test_500_concurrent_sessions():
    n = 500
    with serve_in_subprocess(max_sessions=n + 12) as live:
        c = HttpEnvClient(live.url, token=live.token, retries=0, timeout_s=60, max_connections=128)
        try:
            tasks = [{"prompt": f"Say {i}.", "expected": str(i)} for i in range(n)]
            infos = await asyncio.gather(
                *(c.create_session("echo-v1", t, seed=i) for i, t in enumerate(tasks))
            )
            assert live.healthz()["sessions"] == n, "not all sessions are open at once"

            async def play(i: int, info: SessionInfo) -> float:
                echo = await c.step(info.session_id, [call("echo", f"e{i}", text=f"hello {i}")])
                assert echo.messages[0].content == f"hello {i}" and echo.messages[0].tool_call_id == f"e{i}"
                answer = str(i) if i % 3 else "wrong"
                end = await c.step(info.session_id, [call("submit", answer=answer)])
                assert end.done
                reward = await c.evaluate(info.session_id)
                await c.close_session(info.session_id)
                return reward.reward

            rewards = await asyncio.gather(*(play(i, info) for i, info in enumerate(infos)))
            assert rewards == [0.0 if i % 3 == 0 else 1.0 for i in range(n)]
            assert live.healthz()["sessions"] == 0
            async with httpx.AsyncClient(base_url=live.url, headers=live.auth) as raw:
                metrics = (await raw.get("/metrics")).text
            assert "pqrl_env_errors_total{" not in metrics, f"the server counted errors:\n{metrics}"
            assert 'pqrl_env_step_seconds_count{env="echo-v1"} 1000.0' in metrics
        finally:
            await c.aclose()
