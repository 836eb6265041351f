"""Groups with signal per generated group, with and without the sampler skipping flat tasks, in one run.

A suite of 30 tasks, 10 epochs, groups of 8. Each task has a fixed pass probability, set by a hash
of its id: about 40% of tasks are always solved, 30% never, 30% half the time (the JSON line gives
the split), so only the last carry signal (rewards that differ) when every draw runs. With
``tasks.skip_flat: s`` a task whose last group was flat gives up its next ``s`` draws, so mastered
and hopeless tasks cost one group in ``s + 1`` epochs while the mixed ones run every epoch.

The engine and environment are simulated (10 ms per turn, one tool call, a reward drawn from the
task's pass probability); the rollout manager, the task sampler, the trajectory store and Redis are
real. Real pass rates move as the policy learns, which is why a flat task runs again after ``s``
draws; here they stay put, so this measures the saving, not the re-checking.

Prints one JSON line: per ``skip_flat`` value the groups generated, those with signal, their
fraction and the seconds taken; and ``signal_frac_ratio``, the last value's fraction over the first's.
Usage: python bench/skip_flat.py [--skip-flat 0,2] [--tasks 30] [--epochs 10]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # before bench/, whose engine.py would shadow the engine package

from agent_loop.agent import EpisodeConfig  # noqa: E402
from agent_loop.manager import ManagerConfig, RolloutManager  # noqa: E402
from bench.async_vs_sync import SimEngine  # noqa: E402
from bench.async_vs_sync import SimEnv as TimedEnv  # noqa: E402
from env_server.types import Message, RewardResult, SessionInfo, StepResult  # noqa: E402
from loss_masking import ChatRenderer  # noqa: E402
from pqrl.model_cache import load_tokenizer  # noqa: E402
from pqrl.redis_server import RedisServer  # noqa: E402
from pqrl.store import TrajectoryStore  # noqa: E402
from tasks.calc import calc_suite  # noqa: E402
from tasks.storage import SuiteStore, WeightedSuite  # noqa: E402

G = 8


def pass_probability(task_id: str) -> float:
    """40% of tasks always solved, 30% never, 30% half the time (fixed by the id's hash)."""
    u = int.from_bytes(hashlib.blake2b(task_id.encode(), digest_size=4).digest(), "big") % 10
    return 1.0 if u < 4 else 0.0 if u < 7 else 0.5


class SimEnv(TimedEnv):
    """Done after the first tool call, at once; the reward is drawn from the task's pass probability."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.p: dict[str, float] = {}

    async def create_session(self, env_id, task, seed=None, env_kwargs=None) -> SessionInfo:
        info = await super().create_session(env_id, task, seed, env_kwargs)
        self.p[info.session_id] = pass_probability(task["id"])
        return info

    async def step(self, session_id, tool_calls, request_id=None) -> StepResult:
        msgs = [Message(role="tool", content="ok", tool_call_id=c.id) for c in tool_calls]
        return StepResult(messages=msgs, done=True)

    async def evaluate(self, session_id) -> RewardResult:
        return RewardResult(reward=float(self.rng.random() < self.p.pop(session_id)))


async def one(url: str, renderer: ChatRenderer, skip_flat: int, tasks: int, epochs: int) -> dict[str, Any]:
    run = f"skip{skip_flat}"
    suites = SuiteStore(url)
    await suites.configure_sampler(run, [WeightedSuite(calc_suite(tasks, seed=3))], epochs=epochs, seed=1,
                                   skip_flat=skip_flat)  # fmt: skip
    await suites.aclose()
    store = TrajectoryStore(url, run, max_backlog=0)
    await store.groups.create_consumer_group("trainer")
    episode = EpisodeConfig(max_turns=2, max_new_tokens=64, max_total_tokens=4096)
    cfg = ManagerConfig(group_size=G, groups_per_step=G, max_staleness=10**6, max_concurrent_groups=8,
                        progress_every_s=1e9, episode=episode)  # fmt: skip
    env = SimEnv(skip_flat)
    manager = RolloutManager(store, SimEngine(renderer.tokenizer), env, renderer, cfg)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    stats = await manager.run()
    took = time.perf_counter() - t0
    signal = 0
    while entries := await store.groups.read("trainer", "t", count=100, block_ms=None):
        signal += sum(len({t.reward for t in e.trajectories}) > 1 for e in entries)
        await store.groups.ack("trainer", [e.entry_id for e in entries])
    slots = await store.sampler.position()
    await store.close()
    n = stats.groups_written
    return {"groups": n, "with_signal": signal, "signal_frac": round(signal / n, 3), "slots": slots,
            "seconds": round(took, 1)}  # fmt: skip


async def main(args: argparse.Namespace) -> dict[str, Any]:
    renderer = ChatRenderer(load_tokenizer())
    values = [int(v) for v in args.skip_flat.split(",")]
    out: dict[str, Any] = {}
    with RedisServer() as server:
        for s in values:
            out[f"skip_flat_{s}"] = await one(server.url, renderer, s, args.tasks, args.epochs)
            print(f"skip_flat {s}: {out[f'skip_flat_{s}']}", file=sys.stderr, flush=True)
    first, last = out[f"skip_flat_{values[0]}"], out[f"skip_flat_{values[-1]}"]
    split = collections.Counter(pass_probability(t.id) for t in calc_suite(args.tasks, seed=3).tasks)
    return out | {"signal_frac_ratio": round(last["signal_frac"] / first["signal_frac"], 2),
                  "tasks_by_pass_probability": {str(p): n for p, n in sorted(split.items())}}  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-flat", default="0,2", help="comma-separated values, the first the baseline")
    ap.add_argument("--tasks", type=int, default=30)
    ap.add_argument("--epochs", type=int, default=10)
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
