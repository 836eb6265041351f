"""How the rollout side takes an env server's failure to open a session, over real HTTP: a reset
whose sandbox call failed (a real Docker sandbox) or whose observation holds a NaN is the
environment's error (500 ``environment_error``), so the episode is ``failed_infra`` with the
server's cause, answered once: the manager's bounded reruns apply, the task is never left pending
to be leased again, and the engine is never asked for anything."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent_loop.agent import run_episode
from engine.client import EngineClient
from env_server import registry as registry_module
from env_server.app import ServerSettings, create_app
from env_server.client import HttpEnvClient
from env_server.registry import register_environment
from loss_masking import ChatRenderer
from pqrl.model_cache import load_tokenizer
from pqrl.redis_server import free_port
from pqrl.trajectory import Status
from tests.env_server.envs import BadSetupOnReset
from tests.servers import serve_in_thread

pytestmark = pytest.mark.timeout(120)

ENVS = {
    "pytest-agent-bad-setup-v1": "tests.env_server.envs:BadSetupOnReset",
    "pytest-agent-nonfinite-v1": "tests.env_server.envs:BrokenNonFinite",
}


@pytest.fixture(scope="module")
def env_server() -> Iterator[str]:
    for env_id, entry in ENVS.items():
        register_environment(env_id, entry)
    try:
        settings = ServerSettings(token="agent-env", sandbox_pool_size=0, run="pytest-env-server")
        with serve_in_thread(create_app(settings)) as url:
            yield url
    finally:
        for env_id in ENVS:
            registry_module._REGISTRY.pop(env_id, None)


@pytest.mark.parametrize(
    ("env_id", "task", "cause"),
    [("pytest-agent-bad-setup-v1", {}, "a sandbox call of its setup failed: upload '/workspace' in sandbox"),
     ("pytest-agent-nonfinite-v1", {"where": "reset"}, "not finite (NaN or infinite) at tools[0].function")],
)  # fmt: skip
async def test_a_session_the_environment_cannot_open_is_failed_infra_with_its_cause(
    env_server, env_id, task, cause
):
    BadSetupOnReset.resets = 0
    env = HttpEnvClient(env_server, token="agent-env", retries=3, backoff_s=0.01)
    engine = EngineClient(f"http://127.0.0.1:{free_port()}")  # nothing listens: never asked
    try:
        queued = {"env_id": env_id, "task": task, "task_id": "t1"}
        t = await run_episode(queued, engine=engine, env=env, renderer=ChatRenderer(load_tokenizer()),
                              run_id="r", group_id="g")  # fmt: skip
    finally:
        await env.aclose()
        await engine.aclose()
    assert t.status is Status.FAILED_INFRA and t.reward == 0.0
    error = t.reward_info["error"]
    assert error.startswith("could not open a session: ") and env_id in error and cause in error, error
    assert BadSetupOnReset.resets == (1 if "bad-setup" in env_id else 0), "the failing create was retried"
