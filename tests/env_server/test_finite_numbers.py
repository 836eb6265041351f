"""Non-finite numbers (NaN, infinities, 1e999) are refused at the environment's boundaries: a
tool's arguments (a user's own ``@tool`` included) and the env server's request bodies over real
HTTP. A refused tool call is an ``invalid`` tool message and the episode goes on."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from env_server.app import ServerSettings
from env_server.client import _error
from env_server.environment import ToolEnvironment
from env_server.sessions import TooManySessions
from env_server.tools import tool
from env_server.types import Message, Observation, RewardResult, ToolCall, ToolStatus
from env_server.wrappers import ToolTimeout
from tests.env_server.conftest import ECHO_TASK, call, error_of

pytestmark = pytest.mark.timeout(60)

NAN, INF = float("nan"), float("inf")


class Window(BaseModel):
    """A tool's own nested model that allows NaN: the tool still gets no NaN."""

    model_config = ConfigDict(allow_inf_nan=True)
    seconds: float


class Waiter(ToolEnvironment):
    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.ran: list[Any] = []
        return self.observation([Message(role="user", content="Wait.")])

    @tool
    async def wait(self, seconds: float, extra: list[float] | None = None) -> str:
        """Waits.

        Args:
            seconds: how long.
            extra: more waits.
        """
        self.ran.append(seconds)
        return f"waited {seconds:g}"

    @tool
    async def configure(self, options: dict[str, Any], window: Window | None = None) -> str:
        """Takes free-form options."""
        self.ran.append(options)
        return "configured"


@pytest.mark.parametrize(
    ("name", "arguments", "says"),
    [
        ("wait", {"seconds": INF}, "seconds: Input should be a finite number"),
        ("wait", {"seconds": -INF}, "seconds: Input should be a finite number"),
        ("wait", {"seconds": NAN}, "seconds: Input should be a finite number"),
        ("wait", {"seconds": "nan"}, "seconds: Input should be a finite number"),
        ("wait", {"seconds": "1e999"}, "seconds: Input should be a finite number"),
        ("wait", {"seconds": 1, "extra": [2.0, INF]}, "extra.1: Input should be a finite number"),
        ("configure", {"options": {"timeout": NAN}}, "options.timeout: Input should be a finite number"),
        ("configure", {"options": {"a": [1, {"b": 10**400}]}}, "options.a[1].b: Input should be a finite"),
        ("configure", {"options": {}, "window": {"seconds": "inf"}}, "window.seconds: Input should be a"),
    ],
)  # fmt: skip
async def test_a_non_finite_argument_is_an_invalid_call_and_the_episode_goes_on(name, arguments, says):
    env = Waiter()
    await env.reset(task={})
    result = await env.step([ToolCall(name, arguments, id="bad"), ToolCall("wait", {"seconds": 2}, id="ok")])
    bad, ok = result.messages
    assert bad.status is ToolStatus.INVALID and says in bad.content, bad.content
    assert bad.content.startswith(f"Error: invalid arguments for {name}: ")
    assert (ok.status, ok.content) == (ToolStatus.OK, "waited 2") and not result.done
    assert env.ran == [2.0], "the refused call ran"


def test_the_schema_a_model_sees_is_unchanged_by_the_finite_check():
    params = Waiter.tools["wait"].schema()["function"]["parameters"]
    assert params["properties"]["seconds"] == {"type": "number", "description": "how long."}


def test_a_nan_reward_and_non_finite_server_settings_are_refused():
    with pytest.raises(ValidationError, match="finite number"):
        RewardResult(reward=NAN)
    for field in ("session_ttl_s", "reap_interval_s"):
        with pytest.raises(ValidationError, match="finite number"):
            ServerSettings(insecure_local=True, **{field: INF})
    with pytest.raises(ValueError, match="seconds must be a finite number"):
        ToolTimeout(Waiter(), NAN)


@pytest.mark.parametrize(("header", "seconds"), [("inf", 1.0), ("nan", 1.0), ("soon", 1.0), ("1e9", 3600.0),
                                                  ("-3", 0.0), ("2.5", 2.5)])  # fmt: skip
def test_the_clients_retry_after_is_a_finite_number_of_seconds(header, seconds):
    body = {"error": "too_many_sessions", "detail": ""}
    error = _error("u", httpx.Response(429, headers={"Retry-After": header}, json=body))
    assert isinstance(error, TooManySessions) and error.retry_after == seconds


# ---------------------------------------------------------------- over HTTP

SHAPES = [
    ("step", '{"tool_calls": [{"name": "echo", "arguments": {"text": "x", "n": NaN}}]}',
     "tool_calls[0].arguments.n: numbers must be finite"),
    ("step", '{"tool_calls": [{"name": "echo", "arguments": {"deep": [[{"t": Infinity}]]}}]}',
     "tool_calls[0].arguments.deep[0][0].t: numbers must be finite"),
    ("step", '{"tool_calls": [{"name": "echo", "arguments": {"t": -Infinity}}]}', "numbers must be finite"),
    ("step", '{"tool_calls": [{"name": "echo", "arguments": {"t": 1e999}}]}', "numbers must be finite"),
    ("create", '{"env_id": "echo-v1", "task": {"prompt": "p", "limit": NaN}}',
     "task.limit: numbers must be finite"),
    ("create", '{"env_id": "echo-v1", "env_kwargs": {"format_reward": Infinity}}',
     "env_kwargs.format_reward: numbers must be finite"),
    ("create", '{"env_id": "echo-v1", "seed": 1%s}' % ("0" * 400), "seed: numbers must be finite"),
]  # fmt: skip


@pytest.mark.parametrize(("route", "body", "says"), SHAPES)
async def test_a_body_with_a_non_finite_number_is_422_and_changes_nothing(raw, client, server, route, body,
                                                                          says):  # fmt: skip
    info = await client.create_session("echo-v1", ECHO_TASK)
    path = f"/sessions/{info.session_id}/step" if route == "step" else "/sessions"
    r = await raw.post(path, content=body.encode(), headers={"content-type": "application/json"})
    status, code, detail = error_of(r)
    assert (status, code) == (422, "invalid_request") and says in detail, detail
    assert server.healthz()["sessions"] == 1, "a refused create opened a session"
    step = await client.step(info.session_id, [call("echo", text="still fine")])
    assert step.messages[0].content == "still fine", "a refused request changed the session"
    await client.close_session(info.session_id)
