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
(c) async with the streaming trainer (``train.stream``, the default; ``trainer.streaming``): each
    group is trained as soon as it is read, (1 - OPT_FRAC) T / B seconds, and the optimizer step
    takes the remaining OPT_FRAC T after the B-th; then it publishes. Training time is taken as
    proportional to the groups trained: one pass or several over the same tokens cost the same
    on the CPU quickstart (bench/trainer_memory.py, bf16_one_pass against bf16_two_passes).

The bound. Let D be an episode's duration (3 log-normal latencies + 4 turns of 10 ms) and M_n the
maximum of n independent copies. A sync step costs E[M_64] + T (T = 1 s training). The async trainer
can do no better than T per step, and no better than the staleness gate allows. The gate admits a
group only while accepted + running < (s + v + 1) B (s the max staleness, v the policy version, B
groups per step), so at most (s + 1) B groups are between admission and the trainer's next
publication: generating, waiting to be read, or being trained. A batch holds B of those places for
the T seconds it trains, a fraction T / tau of a step of tau seconds, so on average at most
(s + 1) B - B T / tau groups generate, each for E[M_8] seconds. By Little's law B / tau groups per
second need B E[M_8] / tau of them: E[M_8] <= (s + 1) tau - T, so tau >= (E[M_8] + T) / (s + 1).
Hence

    bound = (E[M_64] + T) / max(T, (E[M_8] + T) / (s + 1)),

with E[M_64] and E[M_8] estimated by Monte Carlo (seeded) in the same run. (A bound that lets every
one of the (s + 1) B places generate all the time, E[M_8] / (s + 1), is 6.41x here; no trainer
that keeps the staleness promise reaches it, since the batch in training holds its places.)

Still optimistic: groups that finished wait to be read until a batch is complete, and stragglers
finish late. The gate bounds staleness at admission; a group admitted within budget that finishes
versions later arrives staler than s. The trainer here screens as the real one does
(trainer.screening.screen_group): an episode whose oldest token is more than s versions old is left out,
and a group left with fewer than two episodes is dropped, its place given back (gate.reject) and
another read instead, so the staleness of what is trained never exceeds s. Reported: staleness at
arrival (a group's oldest member) and as trained (its oldest member trained), the fraction of groups
dropped, and the fraction of the trained groups' episodes used (members_trained_frac).

The manager also culls: a group that can no longer be trained (fewer than two of its episodes
within max_staleness of the policy) is cancelled while it generates, frees its place at once and
its task is queued again. The async side runs twice in the same run, culling off (the baseline:
stragglers hold their places until they finish, only to be dropped) and on.

fraction_of_bound divides the measured speedup by the bound, so it moves with the sync run's own
draws of the heavy-tailed latencies (its measured rate has ranged over 0.97-1.10 groups/s against
1.11 analytic). fraction_of_rate_bound compares the async rate with its analytic best, B / tau,
tau = max(T, (E[M_8] + T) / (s + 1)), and does not.

Streaming changes the bound's T in the places term: a batch holds its B places only for its last
group's share and the optimizer step, T_s = T (OPT_FRAC + (1 - OPT_FRAC) / B), so
tau >= max(T, (E[M_8] + T_s) / (s + 1)) (async_groups_per_s_bound_streaming). fraction_of_bound
and fraction_of_rate_bound stay relative to the batch trainer's bound, as before.

Prints one JSON line: sync_groups_per_s, async_groups_per_s (trained groups, culling and streaming
on), speedup, bound, fraction_of_bound, sync_groups_per_s_analytic, async_groups_per_s_bound,
fraction_of_rate_bound, staleness_at_arrival, staleness_trained, dropped_stale_frac,
members_trained_frac, max_staleness_trained, culled, fraction_of_streaming_rate_bound; and the
same figures of the batch trainer (culling on) under ``no_stream`` and of the batch trainer without
culling under ``no_cull``.
Usage: python bench/async_vs_sync.py [--steps 6] [--opt-frac 0.05]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
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
from pqrl.staleness import MIN_GROUP_EPISODES, within_staleness
from pqrl.store import TrajectoryStore
from tasks.calc import calc_suite
from tasks.storage import SuiteStore, queued_task

CALLS, MEDIAN, SIGMA, G, B, T_TRAIN, STALENESS, GEN_S = 3, 0.3, 1.0, 8, 8, 1.0, 2, 0.01
# The streaming trainer's fixed part of T: clipping and the optimizer step. Measured on the CPU
# quickstart's model: 0.23 s of an 11.6-15.1 s step (bench/optimizer_step.py); 5% leaves room for GPUs.
OPT_FRAC = 0.05


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
    steps: int, url: str, renderer: ChatRenderer, engine: SimEngine, env: SimEnv, *, cull: bool, stream: bool
) -> tuple[float, dict[str, Any]]:
    """Trained groups per second, and the staleness of the groups at arrival and as trained."""
    run = f"async-cull{int(cull)}-stream{int(stream)}"
    suites = SuiteStore(url)
    await suites.submit(calc_suite(steps * B * 2, seed=2), run)
    await suites.aclose()
    store = TrajectoryStore(url, run, max_backlog=0)
    await store.groups.create_consumer_group("trainer")
    cfg = ManagerConfig(
        group_size=G,
        groups_per_step=B,
        max_staleness=STALENESS,
        max_concurrent_groups=(STALENESS + 1) * B,
        episode=EPISODE,
        progress_every_s=1e9,
        cull_stale=cull,
    )
    manager = RolloutManager(store, engine, env, renderer, cfg)  # type: ignore[arg-type]
    arrival: collections.Counter[int] = collections.Counter()  # groups by their oldest member's staleness
    trained: collections.Counter[int] = collections.Counter()  # the same, over the members trained
    members = 0
    t0 = time.perf_counter()
    producing = asyncio.create_task(manager.run())
    for _ in range(steps):
        # As the trainer does: a group older than max_staleness (a straggler, admitted within the
        # budget but finished late) is dropped, its place given back, and another read instead.
        version = (await store.policy.get()).version
        batch: list[Any] = []
        while len(batch) < B:
            arrived = 0
            for e in await store.groups.read("trainer", "t", count=B - len(batch), block_ms=100):
                oldest = [int(t.versions[t.generated.astype(bool)].min()) for t in e.trajectories]
                arrival[version - min(oldest)] += 1
                fresh = [version - o for o in oldest if within_staleness(o, version, STALENESS)]
                if len(fresh) < MIN_GROUP_EPISODES:
                    await store.gate.reject(1)
                    await store.groups.ack("trainer", [e.entry_id])
                else:
                    batch.append(e)
                    trained[max(fresh)] += 1
                    members += len(fresh)
                    arrived += 1
            if stream and arrived:  # as trainer.loop does with train.stream: backpropagate what came
                await asyncio.sleep(arrived * T_TRAIN * (1 - OPT_FRAC) / B)
        await asyncio.sleep(T_TRAIN * OPT_FRAC if stream else T_TRAIN)  # the optimizer step / the whole step
        await store.groups.ack("trainer", [e.entry_id for e in batch])
        engine.version = await store.policy.publish(f"/sim/{version + 1}")
    rate = steps * B / (time.perf_counter() - t0)
    manager.stop()
    await producing
    await store.close()
    read = sum(arrival.values())
    return rate, {
        "staleness_at_arrival": dict(sorted(arrival.items())),
        "staleness_trained": dict(sorted(trained.items())),
        "dropped_stale_frac": round(1 - sum(trained.values()) / read, 3),
        "members_trained_frac": round(members / (steps * B * G), 3),
        "max_staleness_trained": max(trained),
        "culled": manager.stats.groups_culled,
    }


def bound(rng: np.random.Generator, samples: int = 20000) -> float:
    """The speedup bound; ``rate_bound`` gives the async rate behind it."""
    sync_step_s, async_step_s = _bound_steps(rng, samples)
    return sync_step_s / async_step_s


def rate_bound(rng: np.random.Generator, samples: int = 20000) -> tuple[float, float]:
    """The analytic groups per second of the sync trainer and the async trainer's best."""
    sync_step_s, async_step_s = _bound_steps(rng, samples)
    return B / sync_step_s, B / async_step_s


def _bound_steps(rng: np.random.Generator, samples: int, *, stream: bool = False) -> tuple[float, float]:
    d = rng.lognormal(math.log(MEDIAN), SIGMA, size=(samples, 64, CALLS)).sum(-1) + (CALLS + 1) * GEN_S
    m64, m8 = d.max(1).mean(), d[:, :8].max(1).mean()
    # streaming: the batch holds its places only for its last group's share and the optimizer step
    held = T_TRAIN * (OPT_FRAC + (1 - OPT_FRAC) / B) if stream else T_TRAIN
    return m64 + T_TRAIN, max(T_TRAIN, (m8 + held) / (STALENESS + 1))


async def main(steps: int) -> dict[str, float]:
    renderer = ChatRenderer(load_tokenizer())
    with RedisServer() as server:
        sync_rate = await sync_run(steps, renderer, SimEngine(renderer.tokenizer), SimEnv(1))
        print(f"sync: {sync_rate:.2f} groups/s", file=sys.stderr)
        runs = {}
        for cull, stream in ((False, False), (True, False), (True, True)):
            rate, staleness = await async_run(
                steps,
                server.url,
                renderer,
                SimEngine(renderer.tokenizer),
                SimEnv(2),
                cull=cull,
                stream=stream,
            )
            print(f"async (cull {cull}, stream {stream}): {rate:.2f} groups/s, {staleness}", file=sys.stderr)
            runs[cull, stream] = rate, staleness
    b = bound(np.random.default_rng(0))
    sync_analytic, async_best = rate_bound(np.random.default_rng(0))
    _, stream_step_s = _bound_steps(np.random.default_rng(0), 20000, stream=True)

    def figures(rate: float, staleness: dict[str, Any]) -> dict[str, Any]:
        return {
            "async_groups_per_s": round(rate, 3),
            "speedup": round(rate / sync_rate, 2),
            "fraction_of_bound": round(rate / sync_rate / b, 3),
            "fraction_of_rate_bound": round(rate / async_best, 3),
        } | staleness

    return (
        {
            "sync_groups_per_s": round(sync_rate, 3),
            "bound": round(b, 2),
            "sync_groups_per_s_analytic": round(sync_analytic, 3),
            "async_groups_per_s_bound": round(async_best, 3),
            "async_groups_per_s_bound_streaming": round(B / stream_step_s, 3),
            "opt_frac": OPT_FRAC,
        }
        | figures(*runs[True, True])
        | {"fraction_of_streaming_rate_bound": round(runs[True, True][0] * stream_step_s / B, 3)}
        | {"no_stream": figures(*runs[True, False]), "no_cull": figures(*runs[False, False])}
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6, help="training steps of B groups each")
    ap.add_argument("--opt-frac", type=float, default=OPT_FRAC, help="the optimizer step's share of T")
    a = ap.parse_args()
    OPT_FRAC = a.opt_frac
    print(json.dumps(asyncio.run(main(a.steps))))
