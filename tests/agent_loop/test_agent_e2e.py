"""End to end with real parts: the built-in engine and an env server over loopback HTTP, the real
SmolLM2-135M-Instruct, the calc suite's one-shot prompt, and the Redis store. The tool calls are the
model's own samples: no injected text, no forced or biased tokens."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from agent_loop.agent import EpisodeConfig, run_episode
from engine.client import EngineClient
from env_server.app import ServerSettings, create_app
from env_server.client import HttpEnvClient
from loss_masking import ChatRenderer
from pqrl.store import TrajectoryStore
from pqrl.trajectory import Status, ToolStatus
from tasks.calc import calc_suite, safe_eval
from tasks.storage import queued_task
from tests.models import mask_runs, trajectory_logprobs
from tests.servers import serve_in_thread

CFG = EpisodeConfig(max_turns=4, max_new_tokens=48, max_total_tokens=1024, temperature=0.7, seed=7)


@pytest.fixture(scope="module")
def env_url():
    with serve_in_thread(create_app(ServerSettings(token="e2e", sandbox_pool_size=0))) as url:
        yield url


async def test_calc_group_with_the_models_own_tool_calls(served, smollm, env_url, redis_server):
    engine_url, _ = served
    model, tokenizer = smollm
    renderer = ChatRenderer(tokenizer)
    suite = calc_suite(2, seed=21)
    engine, env = EngineClient(engine_url), HttpEnvClient(env_url, token="e2e")
    try:  # two groups of 8, run concurrently as a rollout manager would
        episodes = [
            run_episode(
                queued_task(suite, k),
                engine=engine,
                env=env,
                renderer=renderer,
                run_id="e2e",
                group_id=f"g{k}",
                index=i,
                cfg=CFG,
            )  # fmt: skip
            for k in range(2)
            for i in range(8)
        ]
        done = await asyncio.gather(*episodes)
    finally:
        await engine.aclose()
        await env.aclose()
    groups = [list(done[:8]), list(done[8:])]
    max_diff = 0.0
    for k, t in enumerate(done):
        task = suite.tasks[k // 8]
        assert t.status is not Status.FAILED_INFRA, t.reward_info
        gen = t.generated.astype(bool)
        assert np.array_equal(t.loss_mask, t.generated), "no turn was masked out here"
        assert mask_runs(t.loss_mask) == len(t.turns), "one mask-1 run per assistant turn"
        assert set(t.versions[gen]) == {0} and set(t.versions[~gen]) == {-1}
        text = tokenizer.decode(t.tokens.tolist())
        assert task.question in text, "the prompt the model saw holds the task"
        forced = trajectory_logprobs(model, t.tokens, CFG.temperature)
        max_diff = max(max_diff, float(np.abs(forced[gen] - t.behavior_logprobs[gen]).max()))
        for turn in t.turns[:-1]:  # every tool result the environment returned is in the token stream
            for call in turn.tool_calls:
                if call.name == "calculator" and call.status is ToolStatus.OK:
                    result = str(int(safe_eval(call.arguments["expression"])))
                    assert result in tokenizer.decode(t.tokens[turn.end :].tolist())
    print(f"max |engine logprob - fresh forward| = {max_diff:.2e}")
    assert max_diff < 1e-3
    # The model's own samples: at least one episode made tool calls in two or more turns.
    multi = [t for t in done if len(t.turns) >= 2 and all(u.tool_calls for u in t.turns[:2])]
    assert multi, f"no episode with >= 2 tool-call turns: turns per episode {[len(t.turns) for t in done]}"
    assert all(mask_runs(t.loss_mask) == len(t.turns) >= 2 for t in multi)

    async with TrajectoryStore(redis_server.url, "e2e") as store:
        await store.groups.create_consumer_group("trainer")
        for group in groups:
            await store.groups.put(group)
        entries = await store.groups.read("trainer", "t", count=2)
        assert [e.trajectories for e in entries] == groups


async def test_evaluation_batches_its_greedy_and_sampled_episodes(served, smollm, env_url):
    from agent_loop.evaluation import evaluate

    engine_url, served_engine = served
    suite = calc_suite(3, seed=5)
    engine, env = EngineClient(engine_url), HttpEnvClient(env_url, token="e2e")
    reports: list[tuple[int, int]] = []
    how = {"engine": engine, "env": env, "renderer": ChatRenderer(smollm[1]), "cfg": CFG}
    try:
        greedy_only = await evaluate(suite, k=1, **how)
        rows_before = served_engine.stats.max_batch_rows
        served_engine.stats.max_batch_rows = 0
        both = await evaluate(suite, k=2, progress=lambda d, t: reports.append((d, t)), **how)
    finally:
        served_engine.stats.max_batch_rows = max(rows_before, served_engine.stats.max_batch_rows)
        await engine.aclose()
        await env.aclose()
    metrics = both.metrics
    assert (
        both.solved == greedy_only.solved and both.pass_at_1 == greedy_only.pass_at_1
    )  # greedy: deterministic
    assert metrics["eval/k"] == 2 and 0.0 <= metrics["eval/pass@k"] <= 1.0
    assert metrics["eval/tasks_run"] == 3 and metrics["eval/failed_infra"] == 0 and not both.refused
    assert {t for _, t in reports} == {9} and reports[-1] == (9, 9)  # one total for both passes
    assert [d for d, _ in reports] == sorted(d for d, _ in reports)
    assert served_engine.stats.max_batch_rows > 3  # the 3 greedy episodes ran beside sampled ones
