"""DAPO dynamic sampling in the trainer loop: groups without signal are read past (bounded),
counted, acknowledged and returned to the staleness gate; the step trains on groups with signal."""

from __future__ import annotations

import collections

import torch

from pqrl.store import TrajectoryStore
from tests.conftest import make_trajectory
from tests.models import tiny_llama
from trainer.config import LoopConfig, StepConfig
from trainer.loop import TrainerLoop

STEP = StepConfig(temperature=1.0, max_staleness=1)


def _tiny():
    return tiny_llama(49152, hidden_size=16, layers=1, heads=2, positions=64)


def _group(name: str, rewards: list[float]) -> list:
    return [
        make_trajectory(run_id="ds", group_id=name, index=i, seed=i, reward=r) for i, r in enumerate(rewards)
    ]


async def test_the_loop_reads_past_signal_free_groups_up_to_its_bound(redis_server, tmp_path):
    model = _tiny()
    async with TrajectoryStore(redis_server.url, "ds") as store:
        await store.groups.create_consumer_group("trainer")
        for name, rewards in [
            ("flat1", [0, 0, 0]),
            ("good1", [0, 1, 0]),
            ("flat2", [1, 1, 1]),
            ("good2", [1, 0, 0]),
            ("good3", [0, 0, 1]),
        ]:
            await store.groups.put(_group(name, rewards))
        cfg = LoopConfig(step=STEP, groups_per_step=2, weights_dir=str(tmp_path / "w"), max_extra_reads=2)
        loop = TrainerLoop(model, torch.optim.SGD(model.parameters(), lr=0.1), store, None, cfg)
        m = await loop.step(timeout_s=10)
        assert loop.state.trained_groups == ["flat1", "good1", "flat2", "good2"], "read until 2 carry signal"
        assert m["dropped/no_signal_groups"] == 2 and m["rollout/trajectories_used"] == 6
        assert (await store.gate.state())["rejected"] == 2
        assert await store.groups.backlog() == 1, "the four consumed groups are acknowledged; good3 waits"

        bounded = TrainerLoop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            store,
            None,
            LoopConfig(
                step=STEP,
                groups_per_step=2,
                weights_dir=str(tmp_path / "w2"),
                consumer="t1",
                max_extra_reads=0,
            ),
        )
        for name in ("flat3", "flat4"):
            await store.groups.put(_group(name, [0, 0, 0]))
        m = await bounded.step(timeout_s=10)
        assert bounded.state.trained_groups == ["good3", "flat3"], "max_extra_reads=0 trains what it read"
        assert m["dropped/no_signal_groups"] == 1 and m["rollout/trajectories_used"] == 3


async def test_groups_read_past_free_their_gate_places_while_the_loop_waits(redis_server, tmp_path):
    """Otherwise a full gate admits no new group and the loop waits for one that never comes."""
    import asyncio

    model = _tiny()
    async with TrajectoryStore(redis_server.url, "ds") as store:
        await store.groups.create_consumer_group("trainer")
        for name in ("flat1", "flat2"):
            await store.groups.put(_group(name, [0, 0, 0]))
        cfg = LoopConfig(
            step=STEP,
            groups_per_step=2,
            weights_dir=str(tmp_path / "w"),
            max_extra_reads=1,
            read_block_ms=100,
        )
        loop = TrainerLoop(model, torch.optim.SGD(model.parameters(), lr=0.1), store, None, cfg)
        step = asyncio.create_task(loop.step(timeout_s=30))
        for _ in range(100):
            if (await store.gate.state())["rejected"] == 2:
                break
            await asyncio.sleep(0.05)
        assert (await store.gate.state())["rejected"] == 2 and not step.done(), "freed while still reading"
        # a job whose plan ends now says so in its summary: the waiting step's drops count
        from launcher.plan_end import plan_end_counts

        assert loop.flat_read == 2
        counts = await plan_end_counts(store, loop, collections.Counter(), None)
        assert "read by the trainer 0, dropped by the trainer: no_signal_groups 2" in counts, counts
        for name in ("good1", "good2"):
            await store.groups.put(_group(name, [0, 1, 1]))
        m = await step
        assert m["dropped/no_signal_groups"] == 2 and m["rollout/trajectories_used"] == 6
        assert (await store.gate.state())["rejected"] == 2, "not counted twice"


async def test_a_group_stored_twice_is_consumed_once(redis_server, tmp_path):
    """A producer whose put reply was lost (a Redis restart) retries, so a group can be in the stream
    twice: the copy is left out (also across steps), counted and acknowledged."""
    model = _tiny()
    async with TrajectoryStore(redis_server.url, "ds") as store:
        await store.groups.create_consumer_group("trainer")
        for name in ["a", "a", "b", "b", "c"]:
            await store.groups.put(_group(name, [0, 1, 0]))
        cfg = LoopConfig(step=STEP, groups_per_step=2, weights_dir=str(tmp_path / "w"), max_extra_reads=0)
        loop = TrainerLoop(model, torch.optim.SGD(model.parameters(), lr=0.1), store, None, cfg)
        first = await loop.step(timeout_s=10)
        assert loop.state.trained_groups == ["a", "b"] and first["dropped/duplicate_groups"] == 1
        await store.groups.put(_group("a", [0, 1, 0]))  # a late copy, after "a" was trained
        await store.groups.put(_group("d", [1, 0, 0]))
        second = await loop.step(timeout_s=10)
        assert loop.state.trained_groups == ["a", "b", "c", "d"] and second["dropped/duplicate_groups"] == 2
        assert await store.groups.backlog() == 0, "the copies are acknowledged with the step"
