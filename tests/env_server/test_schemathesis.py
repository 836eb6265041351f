"""Schemathesis against the service's own OpenAPI schema: real requests with the token to a real
uvicorn server; no input, valid or not, may produce a 5xx (502 is only for dead sandboxes, and
echo-v1 has none)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import content_type_conformance, response_schema_conformance

from env_server.app import ServerSettings, create_app
from tests.env_server.conftest import TOKEN, LiveServer, serve_in_thread

SCHEMA = create_app(ServerSettings(token=TOKEN)).openapi()
schema = schemathesis.openapi.from_dict(SCHEMA)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])

_turns = itertools.count()


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    with serve_in_thread(max_sessions=4096) as server:
        yield server


def test_schema_covers_every_route():
    assert SCHEMA["paths"].keys() == {
        "/healthz", "/readyz", "/metrics", "/environments", "/sessions", "/sessions/{session_id}/step",
        "/sessions/{session_id}/evaluate", "/sessions/{session_id}",
    }  # fmt: skip
    op_ids = {op["operationId"] for ops in SCHEMA["paths"].values() for op in ops.values()}
    assert op_ids == {"health", "ready", "metrics", "list_environments", "create_session", "step", "evaluate",
                      "close_session"}  # fmt: skip


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_request_gets_a_5xx(case, live):
    # Every other request on a session route goes to a live echo-v1 session, so the generated
    # tool calls reach the environment instead of stopping at 404.
    if "session_id" in (case.path_parameters or {}) and next(_turns) % 2 == 0:
        r = httpx.post(live.url + "/sessions", json={"env_id": "echo-v1"}, headers=live.auth, timeout=10)
        assert r.status_code == 201, r.text
        case.path_parameters["session_id"] = r.json()["session_id"]
    response = case.call(base_url=live.url, headers=live.auth, timeout=10)
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} -> {response.status_code} {response.text[:500]}\n"
        f"reproduce: {case.as_curl_command(headers=live.auth)}"
    )
    # every answer, errors included, has the body its operation documents
    case.validate_response(response, checks=[response_schema_conformance, content_type_conformance])
    if response.status_code >= 400:
        assert set(response.json()) == {"error", "detail"}, (
            f"{case.method} {case.formatted_path} -> {response.status_code}: "
            f"error body {response.text[:300]} is not {{error, detail}}\n"
            f"reproduce: {case.as_curl_command(headers=live.auth)}"
        )


def test_the_served_spec_is_the_apps_own(live):
    r = httpx.get(live.url + "/openapi.json", headers=live.auth, timeout=10)
    assert r.status_code == 200 and r.json() == SCHEMA
    assert "HTTPValidationError" not in r.text, "422 must document the {error, detail} body it sends"
