"""The session routes' direct path (env_server.fast_path) answers byte for byte what FastAPI's routes
answer: the same requests, well formed or not, sent over real HTTP to two in-thread servers, one
as served and one whose session routes go through FastAPI's full stack, get the same status,
headers and body (session ids aside)."""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pydantic
import pytest
from fastapi import FastAPI

from env_server.registry import register_environment
from env_server.types import RewardResult
from tests.env_server.conftest import ECHO_TASK, NO_SESSION, TOKEN, serve_in_thread
from tests.env_server.envs import CounterEnv

pytestmark = pytest.mark.timeout(120)

AUTH = {"Authorization": f"Bearer {TOKEN}"}
CT = {"Content-Type": "application/json"}
JSON = {**AUTH, **CT}
STEP = {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}, "id": "c1"}], "request_id": "r1"}
CREATE = {"env_id": "echo-v1", "task": ECHO_TASK, "seed": 0}


def chunks(body: bytes) -> Iterator[bytes]:
    yield body[:5]
    yield body[5:]


# (method, path with {s} for the current session and {d} for a finished one, headers, body)
REQUESTS: list[tuple[str, str, dict[str, str], Any]] = [
    ("POST", "/sessions", JSON, CREATE),
    ("POST", "/sessions", {**AUTH, "Content-Type": "application/vnd.pqrl+json; charset=utf-8"}, CREATE),
    ("POST", "/sessions", {**AUTH, "Content-Type": "text/plain"}, CREATE),
    ("POST", "/sessions", AUTH, json.dumps(CREATE).encode()),  # no content type
    ("POST", "/sessions", JSON, b'{"env_id": "echo-v1",'),
    ("POST", "/sessions", JSON, b""),
    ("POST", "/sessions", JSON, b"[1, 2]"),
    ("POST", "/sessions", JSON, {"env_id": "no-such-env-v1"}),
    ("POST", "/sessions", JSON, {**CREATE, "extra": 1}),
    ("POST", "/sessions", JSON, b'{"env_id": "echo-v1", "task": {"x": NaN}}'),
    ("POST", "/sessions", JSON, b'{"env_id": "echo-v1", "task": {"x": "\\ud800"}}'),
    ("POST", "/sessions", JSON, b'{"env_id": "echo-v1", "task": ' + b"[" * 1500 + b"]" * 1500 + b"}"),
    ("POST", "/sessions", JSON, {"env_id": "pytest-fast-broken-v1", "task": {}}),
    ("POST", "/sessions?x=1", JSON, {**CREATE, "request_id": "c-1"}),
    ("POST", "/sessions", JSON, {**CREATE, "request_id": "c-1"}),  # a retried create: the same session
    ("POST", "/sessions", JSON, {**CREATE, "seed": 1, "request_id": "c-1"}),  # reused id, other body
    ("POST", "/sessions/", JSON, CREATE),
    ("PUT", "/sessions", JSON, CREATE),
    ("POST", "/sessions/{s}/step", JSON, STEP),
    ("POST", "/sessions/{s}/step", JSON, STEP),  # a retry: answered again
    ("POST", "/sessions/{s}/step", JSON, {**STEP, "tool_calls": []}),  # the same id, another body
    ("POST", "/sessions/{s}/step", JSON, {"tool_calls": [{"name": "echo", "arguments": "x"}]}),
    ("POST", "/sessions/{s}/step", JSON, {"tool_calls": [{"name": "echo"}] * 65}),
    ("POST", "/sessions/{s}/step", JSON, {"tool_calls": [{"name": "nope", "id": "c9"}]}),
    ("POST", "/sessions/{s}/step", JSON, {"tool_calls": [{"name": "echo", "arguments": {"text": 1e999}}]}),
    ("POST", "/sessions/{s}/step", {**AUTH, "Content-Type": "application/xml"}, STEP),
    ("POST", "/sessions/{s}/step", JSON, ("chunked", {**STEP, "request_id": "r2"})),
    ("POST", "/sessions/{s}/step?debug=1", JSON, {**STEP, "request_id": "r3"}),
    ("POST", "/sessions/{s}/step/", JSON, STEP),
    ("POST", "/sessions//step", JSON, STEP),
    ("POST", "/sessions/{s}/other", JSON, STEP),
    ("GET", "/sessions/{s}/step", AUTH, None),
    ("POST", f"/sessions/{NO_SESSION}/step", JSON, STEP),
    ("POST", "/sessions/{s}/step", CT, STEP),  # no token
    (
        "POST",
        "/sessions/{s}/step",
        {"Authorization": "Bearer wrong", **CT},
        STEP,
    ),
    ("POST", "/sessions/{s}/step", {"Authorization": "Basic x", **CT}, STEP),
    ("POST", "/sessions/{s}/step", JSON, {**STEP, "request_id": "big", "pad": "x" * 5000}),  # over 4 KiB
    ("POST", "/sessions/{s}/step", JSON, {"tool_calls": [{"name": "submit", "arguments": {"answer": "42"}}]}),
    ("POST", "/sessions/{s}/step", JSON, {"tool_calls": [{"name": "echo", "arguments": {"text": "late"}}]}),
    ("POST", "/sessions/{s}/evaluate", AUTH, None),
    ("POST", "/sessions/{s}/evaluate", JSON, b"not json, and ignored"),
    ("GET", "/sessions/{s}/evaluate", AUTH, None),
    ("POST", f"/sessions/{NO_SESSION}/evaluate", AUTH, None),
    ("DELETE", "/sessions/{s}", AUTH, None),
    ("DELETE", "/sessions/{s}", AUTH, None),  # closed already
    ("POST", "/sessions/{s}/step", JSON, STEP),  # closed
    ("DELETE", "/sessions/{s}", {}, None),
    ("POST", "/sessions", JSON, {"env_id": "pytest-fast-extra-v1", "task": {}}),
    ("POST", "/sessions/{s}/evaluate", AUTH, None),  # the reward's extra field is not sent
    ("DELETE", "/sessions/{s}", AUTH, None),
    ("POST", "/sessions", JSON, {"env_id": "pytest-fast-broken-v1", "task": {}}),
    ("POST", "/sessions/{s}/step", JSON, {"tool_calls": [{"name": "count"}]}),  # its step raises
    ("POST", "/sessions", JSON, CREATE),
    ("POST", "/sessions", JSON, CREATE),  # over the limit of 5 sessions: 429 with Retry-After
]


@contextlib.contextmanager
def two_servers() -> Iterator[tuple[str, str]]:
    """(served as is, session routes through FastAPI's stack): same settings, same limits."""
    settings = {"max_sessions": 5, "max_body_bytes": 4096}
    with serve_in_thread(**settings) as direct, serve_in_thread(**settings) as framework:
        app = framework.app
        app.direct = functools.partial(FastAPI.__call__, app)  # type: ignore[attr-defined]
        yield direct.url, framework.url


def replay(url: str) -> list[tuple[int, str]]:
    """Each request of REQUESTS sent in order: (status, the headers but the date and the body, with
    the session ids numbered in the order they appeared)."""
    ids: dict[str, str] = {}
    current = ""
    out = []
    with httpx.Client(base_url=url, timeout=30) as http:
        for method, path, headers, body in REQUESTS:
            if isinstance(body, dict):
                body = json.dumps(body).encode()
            elif isinstance(body, tuple):  # sent in two chunks, with no length declared
                body = chunks(json.dumps(body[1]).encode())
            r = http.request(method, path.format(s=current), headers=headers, content=body)
            if r.status_code == 201:
                current = r.json()["session_id"]
            head = "\n".join(f"{k}: {v.replace(url, 'URL')}" for k, v in r.headers.items() if k != "date")
            text = head.encode() + b"\n\n" + r.content
            for sid in re.findall(rb"[0-9a-f]{32}", text):
                if sid.decode() != NO_SESSION:
                    ids.setdefault(sid.decode(), f"S{len(ids):031d}")
            for sid, label in ids.items():
                text = text.replace(sid.encode(), label.encode())
            out.append((r.status_code, text.decode(errors="replace")))
    return out


class _RewardWithExtra(RewardResult):
    secret: str = "not for the client"


class _Aliased(pydantic.BaseModel):
    internal_name: int = pydantic.Field(serialization_alias="publicName")


class ExtraFieldEnv(CounterEnv):
    """Its evaluate returns a subclass of RewardResult with a field the route does not declare, and
    a model whose wire name differs from its attribute's in ``info``."""

    async def evaluate(self) -> RewardResult:
        return _RewardWithExtra(reward=1.0, info={"d": _Aliased(internal_name=7)})


@pytest.fixture
def broken_env(restore_registry: None) -> None:
    register_environment("pytest-fast-broken-v1", "tests.env_server.envs:BrokenStep")
    register_environment("pytest-fast-extra-v1", f"{__name__}:ExtraFieldEnv")


def test_direct_path_answers_as_fastapi(broken_env: None) -> None:
    with two_servers() as (direct, framework):
        fast, slow = replay(direct), replay(framework)
    assert [s for s, _ in fast] == [s for s, _ in slow], "statuses differ"
    statuses = {s for s, _ in fast}
    # the script reaches every kind of answer it means to compare
    assert {200, 201, 204, 307, 401, 403, 404, 405, 409, 413, 422, 429, 500} <= statuses, statuses
    for request, a, b in zip(REQUESTS, fast, slow, strict=True):
        assert a == b, f"{request[0]} {request[1]}: direct {a} != FastAPI {b}"
    assert not any("not for the client" in text for _, text in fast)
    assert any('"publicName":7' in text for _, text in fast), "a model's wire name, as FastAPI writes it"


JSON_TYPE = "application/json"


def test_two_authorization_headers_are_refused_on_every_route() -> None:
    """Which of two headers counts would depend on who reads them (a dict keeps the last, the
    framework's bearer check the first): a proxy appending its own would be judged differently."""
    with serve_in_thread() as live, httpx.Client(base_url=live.url, timeout=30) as http:
        sid = http.post("/sessions", json=CREATE, headers=AUTH).json()["session_id"]
        token = AUTH["Authorization"]
        for first, second in [("Bearer wrong", token), (token, token), ("Basic eA==", token)]:
            twice = [
                ("Authorization", first),
                ("Authorization", second),
                ("Content-Type", "application/json"),
            ]
            for method, path, body in [
                ("POST", f"/sessions/{sid}/step", STEP),
                ("GET", "/environments", None),
            ]:
                content = json.dumps(body).encode() if body else None
                r = http.request(method, path, headers=twice, content=content)
                assert r.status_code == 401 and "more than one" in r.text, (first, path, r.text)
        assert http.post(f"/sessions/{sid}/step", json=STEP, headers=AUTH).status_code == 200


def test_direct_path_is_taken() -> None:
    """The served app answers the session routes without FastAPI's router: a route FastAPI would
    run is never reached for a well-formed step, and one it does not answer reaches FastAPI."""
    with serve_in_thread() as live, httpx.Client(base_url=live.url, headers=AUTH, timeout=30) as http:
        sid = http.post("/sessions", json=CREATE).json()["session_id"]
        live.app.router.routes.clear()  # FastAPI itself now answers 404 to everything
        r = http.post(f"/sessions/{sid}/step", json=STEP)
        assert r.status_code == 200 and r.json()["messages"][0]["content"] == "hi"
        assert http.post(f"/sessions/{sid}/step", json={"tool_calls": "x"}).status_code == 404
        assert http.delete(f"/sessions/{sid}").status_code == 204
