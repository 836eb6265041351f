"""A suite's reward functions score real episodes: the environment's reward is one term of the
weighted sum the agent loop computes, and a function that fails fails its episode, not the group."""

from __future__ import annotations

import asyncio

import pytest

from agent_loop.agent import run_episode
from agent_loop.demonstrations import ExpertEngine
from agent_loop.difficulty import run_samples
from agent_loop.tool_parser import tool_call_text
from env_server.client import LocalEnvClient
from loss_masking import ChatRenderer
from pqrl import codec
from pqrl.model_cache import load_tokenizer
from pqrl.trajectory import Status
from tasks.calc import calc_suite
from tasks.storage import queued_task
from tasks.suite import Suite, SuiteManifest, parse_suite


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(load_tokenizer())


def _suite(reward: list) -> Suite:
    base = calc_suite(1, seed=7)
    manifest = SuiteManifest.model_validate(base.manifest.model_dump() | {"reward": reward})
    return parse_suite(Suite(manifest, base.tasks).to_jsonl())


def _expert(renderer: ChatRenderer, suite: Suite) -> ExpertEngine:
    task = suite.tasks[0]
    turns = [tool_call_text("calculator", expression=task.expression) + tool_call_text("nope", x=1),
             tool_call_text("answer", value=task.answer)]  # fmt: skip
    return ExpertEngine(renderer, lambda turn, _: turns[turn])


def _episode(renderer: ChatRenderer, reward: list) -> object:
    suite = _suite(reward)

    async def run():
        client = LocalEnvClient()
        try:
            engine = _expert(renderer, suite)
            return await run_episode(queued_task(suite, 0), engine=engine, env=client, renderer=renderer,
                                     run_id="r", group_id="g")  # fmt: skip
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_the_reward_is_the_weighted_sum_of_the_suites_terms(renderer):
    reward = ["exact_match", {"fn": "tool_format", "weight": 0.5},
              {"fn": "length_penalty", "weight": 2.0, "args": {"limit": 1}}]  # fmt: skip
    t = _episode(renderer, reward)
    # 3 calls, 2 ran (the unknown tool did not); far more than 1 generated token: the full penalty
    assert t.status is Status.COMPLETED and t.reward == pytest.approx(1.0 + 0.5 * (2 / 3) - 2.0), (
        t.reward_info
    )
    assert t.reward_info["env_reward"] == 1.0
    assert t.reward_info["reward_terms"] == {
        "0:env": 1.0, "1:tool_format": pytest.approx(2 / 3), "2:length_penalty": -1.0}  # fmt: skip
    assert codec.decode(codec.encode(t)) == t


def test_a_failing_reward_function_fails_its_episode(renderer):
    t = _episode(renderer, ["env", {"fn": "tests.tasks.test_rewards:broken"}])
    assert t.status is Status.FAILED_INFRA and t.reward == 0.0
    assert "reward function tests.tasks.test_rewards:broken failed: RuntimeError" in t.reward_info["error"]


def test_pass_rates_count_the_environments_score_alone(renderer):
    suite = _suite(["env", {"fn": "length_penalty", "weight": 2.0, "args": {"limit": 1}}])

    async def run():
        client = LocalEnvClient()
        try:
            return await run_samples(
                suite, engine=_expert(renderer, suite), env=client, renderer=renderer, samples=1
            )
        finally:
            await client.aclose()

    (sample,) = asyncio.run(run())[suite.tasks[0].id]
    assert sample.reward == 1.0 and not sample.failed_infra, "solved, though the trained reward is -1"
