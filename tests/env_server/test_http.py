"""The env server over real HTTP (uvicorn on loopback) with HttpEnvClient and raw httpx, and the
in-process LocalEnvClient behind the same interface."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from env_server.builtin import EchoEnv
from env_server.client import AuthError, EnvUnavailable, HttpEnvClient, LocalEnvClient
from env_server.registry import register_environment, registry
from env_server.sessions import (
    EnvServerError,
    GraderFailure,
    InfraFailure,
    InvalidRequest,
    NotFound,
    RequestConflict,
    SessionDone,
    SessionManager,
    TooManySessions,
)
from env_server.types import RewardResult, SessionInfo, StepResult, ToolCallRequest, ToolStatus
from sandboxes.docker_api import DockerError
from tests.env_server.conftest import (
    RUN_LABEL,
    TOKEN,
    LiveServer,
    serve_in_subprocess,
    serve_in_thread,
    wait_until_gone,
)
from tests.env_server.envs import BrokenGrader
from tests.sandboxes.agents import FLOOD_COMMAND, flooding_agent_source

pytestmark = pytest.mark.timeout(60)

ECHO_TASK = {"prompt": "Say 42.", "expected": "42"}
SHELL_TASK = {"prompt": "Create hello.txt.", "check": "test -f hello.txt"}
NO_SESSION = "0" * 32


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[HttpEnvClient]:
    c = HttpEnvClient(server.url, token=server.token, retries=1, backoff_s=0.01, timeout_s=30)
    yield c
    await c.aclose()


@pytest.fixture
async def raw(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    """Plain httpx with the token, for status codes and bodies."""
    async with httpx.AsyncClient(base_url=server.url, headers=server.auth, timeout=30) as c:
        yield c


def call(name: str, id: str | None = None, **arguments: Any) -> ToolCallRequest:
    return ToolCallRequest(name=name, arguments=arguments, id=id)


async def echo_episode(client: Any, answer: str = "42") -> tuple[SessionInfo, list[StepResult], RewardResult]:
    info = await client.create_session("echo-v1", ECHO_TASK, seed=0)
    steps = [
        await client.step(info.session_id, [call("echo", "c1", text="hi")]),
        await client.step(info.session_id, [call("submit", "c2", answer=answer)]),
    ]
    reward = await client.evaluate(info.session_id)
    await client.close_session(info.session_id)
    return info, steps, reward


def error_of(r: httpx.Response) -> tuple[int, str, str]:
    body = r.json()
    assert set(body) == {"error", "detail"}, f"error body {body} is not {{error, detail}}"
    return r.status_code, body["error"], body["detail"]


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
    """Every (method, path) of the app's own schema but /healthz, with a made-up session id."""
    routes = [
        (method.upper(), path.replace("{session_id}", NO_SESSION))
        for path, operations in server.app.openapi()["paths"].items()
        if path != "/healthz"
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
    assert (status, code) == (404, "not_found")
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
    assert (status, code) == (422, "invalid_request")
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
    assert (status, code) == (422, "invalid_request"), detail
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


# ---------------------------------------------------------------- environment bugs

GRADER_BUGS = [(0, "RuntimeError: grader bug: nothing to count"), (1, "non-finite reward nan"),
               (2, "PydanticSerializationError")]  # fmt: skip


@pytest.mark.parametrize(("count", "cause"), GRADER_BUGS, ids=["raises", "nan_reward", "info_not_json"])
async def test_a_failing_grader_fails_only_its_episode_over_http(raw, client, server, restore_registry,
                                                                 count, cause):  # fmt: skip
    """A grader bug is the documented 500 ``grader_failure`` naming the cause, raised by the client
    as an InfraFailure without retrying; the other sessions and the server carry on."""
    register_environment("pytest-broken-grader-v1", "tests.env_server.envs:BrokenGrader")
    BrokenGrader.evaluations.clear()
    other = await client.create_session("pytest-broken-grader-v1", {}, env_kwargs={"start": 5})
    broken = await client.create_session("pytest-broken-grader-v1", {}, env_kwargs={"start": count})
    status, code, detail = error_of(await raw.post(f"/sessions/{broken.session_id}/evaluate"))
    assert (status, code) == (500, "grader_failure") and cause in detail, detail
    with pytest.raises(GraderFailure, match=cause) as e:
        await client.evaluate(broken.session_id)
    assert isinstance(e.value, InfraFailure), "a grader bug must make the episode failed_infra"
    assert BrokenGrader.evaluations == [count, count], "a grader failure was retried"
    assert (await client.evaluate(other.session_id)).reward == 5.0
    for s in (other, broken):
        await client.close_session(s.session_id)
    assert server.healthz() == {"ok": True, "sessions": 0}
    r = await raw.get("/metrics")
    assert 'pqrl_env_errors_total{kind="grader"} 2.0' in r.text


async def test_a_failing_grader_is_an_infra_failure_in_process(restore_registry):
    register_environment("pytest-broken-grader-v1", "tests.env_server.envs:BrokenGrader")
    local = LocalEnvClient(SessionManager(pool_size=0))
    try:
        info = await local.create_session("pytest-broken-grader-v1", {})
        with pytest.raises(GraderFailure, match="RuntimeError: grader bug") as e:
            await local.evaluate(info.session_id)
        assert isinstance(e.value.__cause__, RuntimeError)
        await local.close_session(info.session_id)
    finally:
        await local.aclose()


async def test_an_unexpected_exception_still_answers_the_error_body(raw, server, restore_registry):
    register_environment("pytest-broken-step-v1", "tests.env_server.envs:BrokenStep")
    r = await raw.post("/sessions", json={"env_id": "pytest-broken-step-v1"})
    sid = r.json()["session_id"]
    step = {"tool_calls": [{"name": "incr"}]}
    status, code, detail = error_of(await raw.post(f"/sessions/{sid}/step", json=step))
    assert (status, code, detail) == (500, "internal", "RuntimeError: step bug")
    assert (await raw.delete(f"/sessions/{sid}")).status_code == 204
    assert server.healthz() == {"ok": True, "sessions": 0}


# ---------------------------------------------------------------- idempotency


async def test_a_retried_step_is_applied_once_and_answered_identically(raw, client):
    info = await client.create_session("pytest-counter-v1", {})
    path = f"/sessions/{info.session_id}/step"
    body = {"tool_calls": [{"name": "incr", "id": "k"}], "request_id": "req-1"}
    first, second = await raw.post(path, json=body), await raw.post(path, json=body)
    assert first.status_code == second.status_code == 200
    assert first.content == second.content, "a retry was not answered identically"
    assert first.json()["messages"][0]["content"] == "1"
    twice = await asyncio.gather(*(raw.post(path, json={**body, "request_id": "req-2"}) for _ in range(2)))
    assert twice[0].content == twice[1].content and twice[0].json()["messages"][0]["content"] == "2"
    reward = await client.evaluate(info.session_id)
    assert reward.info == {"count": 2}, "a retried step was applied twice"
    # the TurnLimit (3 turns) saw two turns, so one more step is allowed and ends the episode
    last = await client.step(info.session_id, [call("incr")], request_id="req-3")
    assert last.done and last.info == {"truncated": "turn_limit"}
    again = await client.step(info.session_id, [call("incr")], request_id="req-3")
    assert again == last, "a retry after the episode ended must get the original answer, not 409"
    assert (await client.evaluate(info.session_id)).info == {"count": 3}


async def test_a_request_id_reused_with_another_body_is_409_and_changes_nothing(raw, client):
    info = await client.create_session("pytest-counter-v1", {})
    path = f"/sessions/{info.session_id}/step"
    body = {"tool_calls": [{"name": "incr", "id": "k"}], "request_id": "req-1"}
    assert (await raw.post(path, json=body)).status_code == 200
    other = {**body, "tool_calls": [{"name": "incr", "id": "other"}]}
    assert error_of(await raw.post(path, json=other))[:2] == (409, "request_id_conflict")
    with pytest.raises(RequestConflict):  # the client raises the typed error
        await client.step(info.session_id, [call("incr")], request_id="req-1")
    assert (await client.evaluate(info.session_id)).info == {"count": 1}, "a conflicting step ran"
    create = {"env_id": "echo-v1", "task": {"prompt": "p", "expected": "x"}, "request_id": "create-x"}
    first = await raw.post("/sessions", json=create)
    assert first.status_code == 201
    changed = await raw.post("/sessions", json={**create, "task": {"prompt": "q", "expected": "y"}})
    assert error_of(changed)[:2] == (409, "request_id_conflict")
    assert (await raw.post("/sessions", json=create)).json()["session_id"] == first.json()["session_id"]


# ---------------------------------------------------------------- several servers


async def test_sessions_spread_over_servers_and_stick_to_their_own(make_server):
    a, b = make_server(), make_server()
    c = HttpEnvClient([a.url, b.url], token=TOKEN, retries=0)
    try:
        infos = [await c.create_session("pytest-counter-v1", {}) for _ in range(4)]
        assert a.healthz()["sessions"] == 2 and b.healthz()["sessions"] == 2, "sessions did not spread"
        on_a = {s.session_id for s in infos if s.session_id in a.manager._sessions}
        on_b = {s.session_id for s in infos if s.session_id in b.manager._sessions}
        assert len(on_a) == len(on_b) == 2 and not on_a & on_b
        for i, s in enumerate(infos):  # each call must reach the session's server, or it would be 404
            for _ in range(i % 2 + 1):
                await c.step(s.session_id, [call("incr")])
        counts = [(await c.evaluate(s.session_id)).info["count"] for s in infos]
        assert counts == [1, 2, 1, 2]
        for sid in on_a:
            await c.close_session(sid)
        assert a.healthz()["sessions"] == 0 and b.healthz()["sessions"] == 2
        # the emptier server gets the next session
        new = await c.create_session("echo-v1", {})
        assert new.session_id in a.manager._sessions
        with pytest.raises(NotFound, match="not created by this client"):
            await c.step(NO_SESSION, [call("incr")])
        with pytest.raises(NotFound, match="not created by this client"):
            await c.close_session(NO_SESSION)
    finally:
        await c.aclose()


# ---------------------------------------------------------------- retries


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        host, port = s.getsockname()  # closed again: nothing listens here
    return f"http://{host}:{port}"


async def test_dead_server_raises_env_unavailable_after_retries():
    c = HttpEnvClient(_dead_url(), token=TOKEN, retries=2, backoff_s=0.01, timeout_s=2)
    try:
        t0 = time.monotonic()
        with pytest.raises(EnvUnavailable, match="unreachable"):
            await c.environments()
        assert time.monotonic() - t0 < 2
        with pytest.raises(EnvUnavailable):
            await c.create_session("echo-v1", {})
    finally:
        await c.aclose()


class Scripted:
    """A transport that answers with scripted statuses (or transport errors) and records bodies."""

    def __init__(self, script: list[int | type[Exception]]) -> None:
        self.script = script
        self.bodies: list[dict[str, Any] | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content) if request.content else None)
        what = self.script.pop(0)
        if isinstance(what, type):
            raise what("scripted", request=request)
        if what == 200:
            return httpx.Response(200, json=StepResult(messages=[], done=False).model_dump())
        if what == 201:
            info = {"session_id": "s1", "env_id": "echo-v1", "observation": {"messages": [], "tools": []}}
            return httpx.Response(201, json=info)
        code = {502: "infra_failure", 409: "session_done"}.get(what, "internal")
        return httpx.Response(what, json={"error": code, "detail": f"scripted {what}"})


async def scripted_client(
    script: list[int | type[Exception]], retries: int = 3
) -> tuple[HttpEnvClient, Scripted]:
    transport = Scripted([201, *script])
    c = HttpEnvClient("http://scripted", retries=retries, backoff_s=0.001)
    await c._http.aclose()
    c._http = httpx.AsyncClient(transport=httpx.MockTransport(transport))
    await c.create_session("echo-v1", {})
    return c, transport


@pytest.mark.parametrize(
    ("script", "attempts"),
    [([503, 500, 200], 3), ([httpx.ConnectError, httpx.ReadTimeout, 200], 3), ([504, 200], 2)],
)
async def test_step_is_retried_with_the_same_request_id(script, attempts):
    c, t = await scripted_client(script)
    try:
        await c.step("s1", [call("echo", text="x")])
        steps = t.bodies[1:]
        assert len(steps) == attempts
        ids = {b["request_id"] for b in steps}
        assert len(ids) == 1 and None not in ids, f"request ids across retries: {ids}"
    finally:
        await c.aclose()


@pytest.mark.parametrize(("status", "error"), [(502, InfraFailure), (409, SessionDone)])
async def test_502_and_4xx_are_not_retried(status, error):
    c, t = await scripted_client([status, 200])
    try:
        with pytest.raises(error):
            await c.step("s1", [call("echo", text="x")])
        assert len(t.bodies) == 2, "retried a status that must not be retried"
    finally:
        await c.aclose()


async def test_5xx_until_the_last_attempt_raises_with_the_status():
    c, t = await scripted_client([503, 503, 503], retries=2)
    try:
        with pytest.raises(EnvServerError) as e:
            await c.evaluate("s1")
        assert e.value.status == 503 and "scripted 503" in str(e.value)
        assert len(t.bodies) == 4
    finally:
        await c.aclose()


# ---------------------------------------------------------------- sandboxes


async def _sandbox_of(manager: SessionManager, session_id: str) -> str:
    sandbox = manager._sessions[session_id].sandbox
    assert sandbox is not None and sandbox.alive
    return sandbox.id


async def test_dead_sandbox_is_an_infra_failure_over_http(docker_api):
    with serve_in_thread() as live:
        c = HttpEnvClient(live.url, token=live.token, retries=0)
        try:
            a = await c.create_session("shell-v1", SHELL_TASK)
            b = await c.create_session("shell-v1", SHELL_TASK)
            ok = await c.step(a.session_id, [call("run", command="echo alive")])
            assert ok.messages[0].content == "[exit code 0]\nalive\n"
            for s in (a, b):
                await docker_api.kill(await _sandbox_of(live.manager, s.session_id))
            with pytest.raises(InfraFailure, match="sandbox failed"):
                await c.step(a.session_id, [call("run", command="echo dead")])
            async with httpx.AsyncClient(base_url=live.url, headers=live.auth, timeout=30) as raw:
                run = {"tool_calls": [{"name": "run", "arguments": {"command": "true"}}]}
                r = await raw.post(f"/sessions/{b.session_id}/step", json=run)
                status, code, detail = error_of(r)
                assert (status, code) == (502, "infra_failure") and "sandbox failed" in detail, detail
                after = await raw.post(
                    f"/sessions/{a.session_id}/step", json={"tool_calls": [{"name": "submit"}]}
                )
                assert error_of(after)[:2] == (409, "session_done"), (
                    "the session must be done after an infra failure"
                )
            with pytest.raises(InfraFailure):
                await c.evaluate(a.session_id)
            for s in (a, b):
                await c.close_session(s.session_id)
            assert live.healthz()["sessions"] == 0
        finally:
            await c.aclose()
    assert await wait_until_gone(docker_api) == [], "sandboxes outlived the server"


async def test_dead_sandbox_is_an_infra_failure_in_process(docker_api):
    manager = SessionManager(pool_size=0, run=RUN_LABEL)
    local = LocalEnvClient(manager)
    try:
        info = await local.create_session("shell-v1", SHELL_TASK)
        write = await local.step(info.session_id, [call("write_file", path="hello.txt", content="hi")])
        assert write.messages[0].content == "wrote 2 characters to /workspace/hello.txt"
        assert (await local.evaluate(info.session_id)).reward == 1.0
        await docker_api.kill(await _sandbox_of(manager, info.session_id))
        with pytest.raises(InfraFailure):
            await local.step(info.session_id, [call("read_file", path="hello.txt")])
        with pytest.raises(SessionDone):
            await local.step(info.session_id, [call("submit")])
        await local.close_session(info.session_id)
    finally:
        await local.aclose()
    assert await wait_until_gone(docker_api) == []


# Memory in a memfd belongs to no process, so the OOM killer takes the largest one: the agent.
MEMFD_BOMB = (
    'python3 -c \'import itertools, os; fd = os.memfd_create("m"); '
    "any(os.write(fd, bytes(1 << 20)) < 0 for _ in itertools.count())'"
)


@pytest.mark.parametrize(
    "command",
    [MEMFD_BOMB, FLOOD_COMMAND],
    ids=["oom_kill_the_agent", "flood_the_channel"],
)
async def test_a_command_that_breaks_its_own_sandbox_scores_zero_not_failed_infra(
    docker_api, monkeypatch, command
):
    """The policy's own doing is its failure: the episode ends, evaluates to 0 with the cause, and
    is never an infrastructure failure (which would be retried and left out of training)."""
    if command == FLOOD_COMMAND:  # commands cannot reach the host channel: an altered agent floods it
        monkeypatch.setattr("sandboxes.docker.AGENT_SOURCE", flooding_agent_source())
    manager = SessionManager(pool_size=0, run=RUN_LABEL)
    local = LocalEnvClient(manager)
    try:
        info = await local.create_session("shell-v1", SHELL_TASK)
        await local.step(info.session_id, [call("write_file", path="hello.txt", content="hi")])
        result = await local.step(info.session_id, [call("run", id="c1", command=command)])
        assert result.done and result.messages[0].status is ToolStatus.ERROR, result
        assert result.messages[0].tool_call_id == "c1" and "sandbox stopped" in result.messages[0].content
        reward = await local.evaluate(info.session_id)
        assert reward.reward == 0.0 and reward.info["cause"], reward
        with pytest.raises(SessionDone):
            await local.step(info.session_id, [call("submit")])
        await local.close_session(info.session_id)
    finally:
        await local.aclose()
    assert await wait_until_gone(docker_api) == []


async def test_reset_crash_releases_the_sandbox(docker_api, restore_registry):
    register_environment("pytest-crash-v1", "tests.env_server.envs:SandboxCrashOnReset")
    manager = SessionManager(pool_size=0, run=RUN_LABEL)
    try:
        with pytest.raises(Exception, match="reset crashed"):
            await manager.create("pytest-crash-v1", {})
        assert manager.live == 0
    finally:
        await manager.shutdown()  # destroys what the pool holds; an acquired sandbox is the session's
    assert await wait_until_gone(docker_api, timeout=2) == [], "the sandbox of a failed reset leaked"


async def test_pool_size_zero_keeps_no_idle_sandbox(docker_api):
    manager = SessionManager(pool_size=0, run=RUN_LABEL)
    try:
        info = await manager.create("shell-v1", SHELL_TASK)
        pool = next(iter(manager._pools.values()))
        deadline = time.monotonic() + 1.5
        while pool.idle == 0 and pool.stats.created < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert (pool.stats.created, pool.idle) == (1, 0), "a spare sandbox was made"
        await manager.close(info.session_id)
    finally:
        await manager.shutdown()


async def test_idle_sessions_are_reaped_and_release_their_sandbox(docker_api, ttl_server):
    c = HttpEnvClient(ttl_server.url, token=ttl_server.token, retries=0)
    try:
        idle = await c.create_session("shell-v1", SHELL_TASK)
        busy = await c.create_session("echo-v1", ECHO_TASK)
        cid = await _sandbox_of(ttl_server.manager, idle.session_id)
        deadline = time.monotonic() + 1.5  # three TTLs: the busy session is used every 0.1 s
        while time.monotonic() < deadline:
            await c.evaluate(busy.session_id)
            await asyncio.sleep(0.1)
        assert idle.session_id not in ttl_server.manager._sessions, "an idle session was not reaped"
        with pytest.raises(NotFound):
            await c.step(idle.session_id, [call("submit")])
        assert (await c.evaluate(busy.session_id)).reward == 0.0, "a busy session was reaped"
        for _ in range(100):  # the pool removes released sandboxes in the background
            try:
                await docker_api.inspect(cid)
            except DockerError as e:
                assert e.status == 404
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the reaped session's sandbox {cid[:12]} still exists")
    finally:
        await c.aclose()


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


async def test_a_retried_create_returns_the_same_session(server):
    auth = {"Authorization": f"Bearer {server.token}"}
    async with httpx.AsyncClient(base_url=server.url, headers=auth) as c:
        body = {"env_id": "echo-v1", "task": {"prompt": "p", "expected": "x"}, "request_id": "create-1"}
        first, again = await asyncio.gather(c.post("/sessions", json=body), c.post("/sessions", json=body))
        assert first.status_code == again.status_code == 201
        assert first.json()["session_id"] == again.json()["session_id"]
        other = await c.post("/sessions", json={**body, "request_id": "create-2"})
        assert other.json()["session_id"] != first.json()["session_id"]
        assert (await c.get("/healthz")).json()["sessions"] == 2
