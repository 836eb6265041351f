"""Asynchronous vs synchronous RL: the same groups through (a) synchronous batches and (b) the
rollout manager with its Redis staleness gate (max staleness 2), in the same run.

Fixed parameters: 3 tool calls per episode, each tool call's latency log-normal with
median 0.3 s and sigma 1.0, G = 8 episodes per group, 8 groups per training step, a simulated
training step of 1.0 s. The engine is simulated (10 ms per turn, a fixed tool-call reply), the
environment too (the latency above); everything else is real: the agent loop, the chat template,
the Trajectory codec, Redis, the trajectory store, the staleness gate and the rollout manager.

(a) sync: per step, start 8 groups (64 episodes) at once, wait for the slowest, train 1 s.
(b) async: the manager admits groups while the gate allows; a trainer loop reads 8 groups, trains
    1 s and publishes a new policy version, which frees 8 more places in the gate.

The bound. Let D be an episode's duration (3 log-normal latencies + 4 turns of 10 ms) and M_n the
maximum of n independent copies. A sync step costs E[M_64] + T (T = 1 s training). The async trainer
can do no better than T per step, and no better than the rollout side allows: with staleness s and
B groups per step, at most (s + 1) B groups are admitted ahead of the trainer, each taking E[M_8],
so groups arrive at most (s + 1) B / E[M_8] per second and a step needs at least B E[M_8] / ((s + 1) B)
= E[M_8] / (s + 1) seconds. Hence

    bound = (E[M_64] + T) / max(T, E[M_8] / (s + 1)),

with E[M_64] and E[M_8] estimated by Monte Carlo (seeded) in the same run.

This bound is optimistic: it assumes a finished group frees its place at once, but the gate frees
places only when the trainer publishes a version (accepted + running may reach (s + v + 1) B), so
a heavy-tailed straggler holds a place until the trainer has moved on without it. The same fact
makes the staleness seen at consumption exceed s for stragglers: the gate bounds admission, and the
trainer must still drop samples older than its ``max_staleness`` (freeing places with gate.reject).

Prints one JSON line: sync_groups_per_s, async_groups_per_s, speedup, bound, max_staleness_seen.
Usage: python bench/async_vs_sync.py [--steps 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_loop.agent import EpisodeConfig, run_episode
from agent_loop.manager import ManagerConfig, RolloutManager
from engine.protocol import Engine
from engine.types import FinishReason, Generation, SamplingParams
from env_server.types import Message, Observation, RewardResult, SessionInfo, StepResult
from loss_masking import ChatRenderer
from pqrl.model_cache import load_tokenizer
from pqrl.redis_server import RedisServer
from pqrl.store import TrajectoryStore
from tasks.calc import calc_suite
from tasks.storage import SuiteStore, queued_task

CALLS, MEDIAN, SIGMA, G, B, T_TRAIN, STALENESS, GEN_S = 3, 0.3, 1.0, 8, 8, 1.0, 2, 0.01


class SimEngine(Engine):
    """Answers every turn with one tool call after GEN_S, tagged with the current policy version."""

    def __init__(self, tokenizer: Any) -> None:
        text = '<tool_call>{"name": "work", "arguments": {}}</tool_call><|im_end|>'
        self.ids = tokenizer.encode(text, add_special_tokens=False)
        self.version = 0

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        *,
        rollout_id: str | None = None,
    ) -> Generation:
        await asyncio.sleep(GEN_S)
        n = len(self.ids)
        return Generation(self.ids, [-0.1] * n, [self.version] * n, FinishReason(type="stop", matched=2), "",
                          len(input_ids), 1, "sim")  # fmt: skip

    def release(self, rollout_id: str) -> None:
        pass


class SimEnv:
    """An environment whose every tool call takes a log-normal time; done after CALLS calls."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.calls: dict[str, int] = {}

    async def create_session(self, env_id, task, seed=None, env_kwargs=None) -> SessionInfo:
        sid = f"s{len(self.calls)}-{self.rng.random()}"
        self.calls[sid] = 0
        obs = Observation(messages=[Message(role="user", content=task["question"])], tools=[])
        return SessionInfo(session_id=sid, env_id=env_id, observation=obs)

    async def step(self, session_id, tool_calls, request_id=None) -> StepResult:
        await asyncio.sleep(self.rng.lognormvariate(math.log(MEDIAN), SIGMA))
        self.calls[session_id] += 1
        msgs = [Message(role="tool", content="ok", tool_call_id=c.id) for c in tool_calls]
        return StepResult(messages=msgs, done=self.calls[session_id] >= CALLS)

    async def evaluate(self, session_id) -> RewardResult:
        return RewardResult(reward=float(self.rng.random() < 0.5))

    async def close_session(self, session_id) -> None:
        self.calls.pop(session_id, None)

    async def aclose(self) -> None:
        pass


EPISODE = EpisodeConfig(max_turns=CALLS + 1, max_new_tokens=64, max_total_tokens=4096)


async def sync_run(steps: int, renderer: ChatRenderer, engine: SimEngine, env: SimEnv) -> float:
    suite = calc_suite(B, seed=1)
    t0 = time.perf_counter()
    for _ in range(steps):
        await asyncio.gather(
            *(
                run_episode(
                    queued_task(suite, k),
                    engine=engine,
                    env=env,
                    renderer=renderer,
                    run_id="sync",
                    group_id=f"g{k}",
                    index=i,
                    cfg=EPISODE,
                )  # fmt: skip
                for k in range(B)
                for i in range(G)
            )
        )
        await asyncio.sleep(T_TRAIN)  # the synchronous trainer waits for the slowest episode
        engine.version += 1
    return steps * B / (time.perf_counter() - t0)


async def async_run(
    steps: int, url: str, renderer: ChatRenderer, engine: SimEngine, env: SimEnv
) -> tuple[float, int]:
    suites = SuiteStore(url)
    await suites.submit(calc_suite(steps * B, seed=2), "async")
    await suites.aclose()
    store = TrajectoryStore(url, "async", max_backlog=0)
    await store.groups.create_consumer_group("trainer")
    cfg = ManagerConfig(
        group_size=G,
        groups_per_step=B,
        max_staleness=STALENESS,
        max_concurrent_groups=(STALENESS + 1) * B,
        episode=EPISODE,
        progress_every_s=1e9,
    )
    manager = RolloutManager(store, engine, env, renderer, cfg)  # type: ignore[arg-type]
    staleness: list[int] = []
    t0 = time.perf_counter()
    producing = asyncio.create_task(manager.run())
    for _ in range(steps):
        batch: list[Any] = []
        while len(batch) < B:
            batch += await store.groups.read("trainer", "t", count=B - len(batch), block_ms=100)
        version = (await store.policy.get()).version
        for e in batch:
            v = np.concatenate([t.versions[t.generated.astype(bool)] for t in e.trajectories])
            staleness.append(version - int(v.min()))
        await asyncio.sleep(T_TRAIN)  # train on them
        await store.groups.ack("trainer", [e.entry_id for e in batch])
        engine.version = await store.policy.publish(f"/sim/{version + 1}")
    rate = steps * B / (time.perf_counter() - t0)
    await producing
    await store.close()
    return rate, max(staleness)


def bound(rng: np.random.Generator, samples: int = 20000) -> float:
    d = rng.lognormal(math.log(MEDIAN), SIGMA, size=(samples, 64, CALLS)).sum(-1) + (CALLS + 1) * GEN_S
    m64, m8 = d.max(1).mean(), d[:, :8].max(1).mean()
    return (m64 + T_TRAIN) / max(T_TRAIN, m8 / (STALENESS + 1))


async def main(steps: int) -> dict[str, float]:
    renderer = ChatRenderer(load_tokenizer())
    with RedisServer() as server:
        sync_rate = await sync_run(steps, renderer, SimEngine(renderer.tokenizer), SimEnv(1))
        print(f"sync: {sync_rate:.2f} groups/s", file=sys.stderr)
        async_rate, seen = await async_run(
            steps, server.url, renderer, SimEngine(renderer.tokenizer), SimEnv(2)
        )
        print(f"async: {async_rate:.2f} groups/s, max staleness {seen}", file=sys.stderr)
    b = bound(np.random.default_rng(0))
    return {
        "sync_groups_per_s": round(sync_rate, 3),
        "async_groups_per_s": round(async_rate, 3),
        "speedup": round(async_rate / sync_rate, 2),
        "bound": round(b, 2),
        "max_staleness_seen": seen,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6, help="training steps of B groups each")
    print(json.dumps(asyncio.run(main(ap.parse_args().steps))))
