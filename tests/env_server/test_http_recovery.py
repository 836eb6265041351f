"""The env server over real HTTP when something fails: an environment's bugs, requests retried
(answered once, applied once), sessions spread over several servers, and the client's retries."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
import pytest

from env_server.client import EnvUnavailable, HttpEnvClient, LocalEnvClient
from env_server.registry import register_environment
from env_server.sessions import (
    EnvServerError,
    GraderFailure,
    InfraFailure,
    NotFound,
    RequestConflict,
    SessionDone,
    SessionManager,
)
from env_server.types import StepResult
from tests.env_server.conftest import (
    NO_SESSION,
    TOKEN,
    call,
    error_of,
)
from tests.env_server.envs import BrokenGrader

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- environment bugs

GRADER_BUGS = [(0, "RuntimeError: grader bug: nothing to count"), (1, "Input should be a finite number"),
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
