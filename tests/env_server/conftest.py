"""Fixtures for env server tests: real uvicorn servers on free loopback ports, in a thread of this
process (so a test can reach the server's SessionManager) or as a subprocess; a registry that is
restored after tests that register environments; a check that no sandbox outlives its test; and
the clients and the echo episode the HTTP tests share.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from env_server import registry as registry_module
from env_server.app import ServerSettings, create_app
from env_server.client import HttpEnvClient
from env_server.http_guard import uvicorn_options
from env_server.sessions import SessionManager
from env_server.types import RewardResult, SessionInfo, StepResult, ToolCall
from sandboxes.docker import owner_id
from sandboxes.docker_api import DockerAPI
from tests.env_server import envs  # noqa: F401  (registers the test environments)
from tests.servers import LiveServer, env_server_process, loopback_socket

TOKEN = "pytest-env-token"
RUN_LABEL = "pytest-env-server"  # pqrl.run of every sandbox these tests' managers create


@contextlib.contextmanager
def serve_in_thread(token: str = TOKEN, **settings: Any) -> Iterator[LiveServer]:
    """Runs ``create_app`` under uvicorn in a thread with its own event loop; stops it on exit.

    The SessionManager is made here (with the settings' limits and a pytest sandbox label), so
    tests can look inside it, e.g. to find a session's sandbox.
    """
    s = ServerSettings(token=token, sandbox_pool_size=0, **settings)
    manager = SessionManager(
        max_sessions=s.max_sessions, ttl_s=s.session_ttl_s, pool_size=s.sandbox_pool_size, run=RUN_LABEL
    )
    app = create_app(s, manager=manager)
    sock = loopback_socket()
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=5, backlog=2048,
        **uvicorn_options(s),
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive(), "uvicorn thread exited during startup"
        assert time.monotonic() < deadline, "uvicorn did not start within 15 s"
        time.sleep(0.01)
    host, port = sock.getsockname()
    try:
        yield LiveServer(f"http://{host}:{port}", token, manager, s, app, owner_id())
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()
        assert not thread.is_alive(), "uvicorn thread did not stop within 20 s"


def serve_in_subprocess(token: str = TOKEN, **env: Any) -> contextlib.AbstractContextManager[LiveServer]:
    """An env server in its own process (tests.servers.env_server_process), with this package's token."""
    return env_server_process(token, **env)


@pytest.fixture
def make_server() -> Iterator[Callable[..., LiveServer]]:
    """Factory: ``make_server(max_sessions=2, ...)`` starts an in-thread server, stopped at teardown."""
    with contextlib.ExitStack() as stack:
        yield lambda **settings: stack.enter_context(serve_in_thread(**settings))


@pytest.fixture
def server(make_server) -> LiveServer:
    return make_server()


@pytest.fixture
def limited_server(make_server) -> LiveServer:
    """Small limits: two sessions, 4 KiB bodies."""
    return make_server(max_sessions=2, max_body_bytes=4096)


@pytest.fixture
def ttl_server(make_server) -> LiveServer:
    """Sessions idle for 0.5 s are reaped; the reaper runs every 0.1 s."""
    return make_server(session_ttl_s=0.5, reap_interval_s=0.1)


@pytest.fixture
def restore_registry() -> Iterator[None]:
    """Environments registered by the test are forgotten afterwards."""
    registry_module.load_plugins()
    saved = dict(registry_module._REGISTRY)
    yield
    registry_module._REGISTRY.clear()
    registry_module._REGISTRY.update(saved)


async def leftover_sandboxes(api: DockerAPI) -> list[dict[str, Any]]:
    return await api.list({"pqrl.run": RUN_LABEL, "pqrl.owner": owner_id()})


async def wait_until_gone(api: DockerAPI, timeout: float = 15.0) -> list[dict[str, Any]]:
    """Polls (bounded) until this process has no pytest sandbox left; returns what is left."""
    deadline = time.monotonic() + timeout
    while (left := await leftover_sandboxes(api)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return left


@pytest.fixture
async def docker_api() -> AsyncIterator[DockerAPI]:
    """A Docker client. Tests assert ``await wait_until_gone(docker_api) == []`` themselves once
    their servers are stopped; whatever is still left at teardown is removed here."""
    api = DockerAPI()
    try:
        yield api
    finally:
        for c in await leftover_sandboxes(api):
            with contextlib.suppress(Exception):
                await api.remove(c["Id"])
        await api.close()


# ---------------------------------------------------------------- clients and episodes

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


def call(name: str, id: str | None = None, **arguments: Any) -> ToolCall:
    return ToolCall(name=name, arguments=arguments, id=id)


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
