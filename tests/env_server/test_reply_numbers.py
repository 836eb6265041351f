"""Non-finite numbers in the env server's replies, over real HTTP: an environment that puts NaN or
an infinity in its observation, a step's info, its grader's info or its reward gets an error reply
naming the field (its fault), never a reply carrying ``NaN`` (not JSON) or a silent ``null``; and
the HTTP client refuses such a reply from any server, a NaN reward first of all."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from env_server.client import HttpEnvClient, InvalidReply
from env_server.registry import register_environment
from env_server.sessions import EnvironmentBroken, GraderFailure, SessionDone
from pqrl.finite import loads_finite
from tests.env_server.conftest import call, error_of
from tests.servers import serve_in_thread

pytestmark = pytest.mark.timeout(60)

ENV = "pytest-nonfinite-v1"


@pytest.fixture
def nonfinite_env(restore_registry) -> str:
    register_environment(ENV, "tests.env_server.envs:BrokenNonFinite")
    register_environment("pytest-inf-default-v1", "tests.env_server.envs:BrokenInfiniteDefault")
    return ENV


async def test_a_non_finite_observation_fails_the_create_naming_the_field(nonfinite_env, raw, client, server):
    r = await raw.post("/sessions", json={"env_id": ENV, "task": {"where": "reset"}})
    status, code, detail = error_of(r)
    assert (status, code) == (500, "environment_error"), detail
    assert ENV in detail and "reset replied a number that is not finite" in detail, detail
    assert "tools[0].function.x-weight" in detail, detail
    assert server.healthz()["sessions"] == 0, "the failed create left a session open"
    with pytest.raises(EnvironmentBroken, match="x-weight"):
        await client.create_session(ENV, {"where": "reset"})


async def test_a_non_finite_step_info_is_an_error_reply_and_ends_the_episode(nonfinite_env, raw, client):
    info = await client.create_session(ENV, {"where": "step"})
    r = await raw.post(f"/sessions/{info.session_id}/step", json={"tool_calls": [{"name": "measure"}]})
    status, code, detail = error_of(r)  # a JSON body: the reply never carried the NaN
    assert (status, code) == (500, "environment_error"), detail
    assert ENV in detail and "info.metrics.loss[1]" in detail, detail
    with pytest.raises(SessionDone):
        await client.step(info.session_id, [call("measure")])
    await client.close_session(info.session_id)


@pytest.mark.parametrize(("where", "field"), [("evaluate", "info.verifier.score"), ("reward", "at reward")])
async def test_a_non_finite_score_is_a_grader_failure_naming_the_field(
    nonfinite_env, raw, client, where, field
):
    info = await client.create_session(ENV, {"where": where})
    r = await raw.post(f"/sessions/{info.session_id}/evaluate")
    status, code, detail = error_of(r)
    assert (status, code) == (500, "grader_failure") and field in detail, detail
    with pytest.raises(GraderFailure, match="not finite"):
        await client.evaluate(info.session_id)
    await client.close_session(info.session_id)


async def test_a_tool_schema_with_an_infinite_default_is_listed_as_an_error(nonfinite_env, raw):
    r = await raw.get("/environments")
    listed = {e["id"]: e for e in loads_finite(r.content)}  # the reply is JSON with finite numbers
    broken = listed["pytest-inf-default-v1"]
    assert broken["tools"] == [] and "not finite" in broken["error"], broken
    assert "default" in broken["error"], broken
    assert listed[ENV]["tools"] and "error" not in listed[ENV]


# ---------------------------------------------------------------- the client, against any server

SESSION = {"session_id": "s1", "env_id": "e", "observation": {"messages": [], "tools": []}}
BAD_REPLIES = {
    "nan_reward": b'{"reward": NaN, "info": {}}',
    "infinite_reward": b'{"reward": Infinity, "info": {}}',
    "huge_reward": b'{"reward": 1e999, "info": {}}',
    "nan_in_info": b'{"reward": 1.0, "info": {"score": [1, -Infinity]}}',
    "not_json": b"reward: 1",
    "no_reward": b'{"info": {}}',
}


@pytest.mark.parametrize("body", BAD_REPLIES.values(), ids=BAD_REPLIES.keys())
async def test_the_client_refuses_a_reply_that_is_not_finite_json_and_does_not_retry(body):
    """A server (any: a rogue, an old version) answers evaluate with a non-finite reward or info:
    the client raises InvalidReply (502, the environment side's fault: failed_infra), once."""
    evaluations = []

    async def create(request: Request) -> Response:
        return Response(json.dumps(SESSION), 201, media_type="application/json")

    async def step(request: Request) -> Response:
        return Response(
            b'{"messages": [], "done": false, "info": {"loss": NaN}}', media_type="application/json"
        )

    async def evaluate(request: Request) -> Response:
        evaluations.append(1)
        return Response(body, media_type="application/json")

    app = Starlette(routes=[Route("/sessions", create, methods=["POST"]),
                            Route("/sessions/s1/step", step, methods=["POST"]),
                            Route("/sessions/s1/evaluate", evaluate, methods=["POST"])])  # fmt: skip
    with serve_in_thread(app) as url:
        client = HttpEnvClient(url, retries=3, backoff_s=0.01)
        try:
            info = await client.create_session("e", {})
            with pytest.raises(InvalidReply) as raised:
                await client.evaluate(info.session_id)
            assert raised.value.status == 502 and url in str(raised.value)
            assert evaluations == [1], "a bad reply was asked for again"
            with pytest.raises(InvalidReply, match="not a finite number"):
                await client.step(info.session_id, [call("measure")])
        finally:
            await client.aclose()


async def test_a_finite_reply_still_passes_the_client(client):
    info = await client.create_session("echo-v1", {"prompt": "p", "expected": "1.5"})
    await client.step(info.session_id, [call("submit", answer="1.5")])
    assert (await client.evaluate(info.session_id)).reward == 1.0
    await client.close_session(info.session_id)
