"""A weight update in the middle of multi-turn rollouts: every token keeps the version that
produced it. The update happens when the first tool call reaches the environment, so turns before
it are version 0, turns after it version 1, and a turn in flight switches where the engine
aborted it; every logprob matches a fresh forward pass of the weights of its own version."""

from __future__ import annotations

import asyncio

import numpy as np

from agent_loop.agent import run_episode
from engine.client import EngineClient
from env_server.client import LocalEnvClient
from loss_masking import ChatRenderer
from tasks.calc import calc_suite
from tasks.storage import queued_task
from tests.agent_loop.test_agent_e2e import CFG
from tests.models import trajectory_logprobs


class _UpdateOnFirstStep(LocalEnvClient):
    """An environment client that, like a trainer finishing a step, publishes new weights once."""

    def __init__(self, engine: EngineClient, path: str) -> None:
        super().__init__()
        self.engine, self.path, self.updated = engine, path, asyncio.Event()

    async def step(self, session_id, tool_calls, request_id=None):
        if not self.updated.is_set():
            self.updated.set()
            await self.engine.update_weights_from_disk(str(self.path), 1)
        return await super().step(session_id, tool_calls, request_id)


async def test_versions_follow_a_weight_update_between_and_within_turns(updatable, smollm):
    url, _, path, new_model = updatable
    old_model, tokenizer = smollm
    engine = EngineClient(url)
    env = _UpdateOnFirstStep(engine, path)
    suite = calc_suite(2, seed=21)
    try:
        done = await asyncio.gather(
            *(
                run_episode(
                    queued_task(suite, k),
                    engine=engine,
                    env=env,
                    renderer=ChatRenderer(tokenizer),
                    run_id="v",
                    group_id=f"g{k}",
                    index=i,
                    cfg=CFG,
                )  # fmt: skip
                for k in range(2)
                for i in range(8)
            )
        )
    finally:
        await engine.aclose()
        await env.aclose()
    assert env.updated.is_set(), "no episode reached the environment"
    multi = [t for t in done if len(t.turns) >= 2]
    assert multi, "no multi-turn episode"
    saw_both = 0
    for t in done:
        gen = t.generated.astype(bool)
        v = t.versions[gen]
        assert set(v) <= {0, 1} and np.all(np.diff(v) >= 0), "versions never go back"
        if len(t.turns) >= 2:
            last = t.turns[-1]
            assert set(t.versions[last.start : last.end]) == {1}, "a turn started after the update is v1"
        for version, model in ((0, old_model), (1, new_model)):
            at = gen & (t.versions == version)
            if at.any():
                forced = trajectory_logprobs(model, t.tokens, CFG.temperature)
                assert np.abs(forced[at] - t.behavior_logprobs[at]).max() < 1e-3, f"v{version} logprobs"
        saw_both += set(v) == {0, 1}
    assert saw_both >= 1, "some episode has tokens of both versions"
