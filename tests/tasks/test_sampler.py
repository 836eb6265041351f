"""The task sampler: the pure schedule (mixing, epochs, seeds, end) against a brute-force merge, and
its claims in a real Redis (no slot twice across concurrent managers, resume, reclaim)."""

from __future__ import annotations

import asyncio
import collections
import heapq
from fractions import Fraction

import pytest

from pqrl.store import StoreError, TaskOutcome, TrajectoryStore
from tasks.calc import calc_suite
from tasks.sampler import SamplerConfig, Schedule, Slot, SuiteShare, permutation, skips
from tasks.storage import RunSampler, SuiteStore, WeightedSuite, queued_task, task_key


def config(*suites: tuple[str, int, float], epochs: int | None = None, seed: int = 0) -> SamplerConfig:
    return SamplerConfig(tuple(SuiteShare(*s) for s in suites), epochs, seed)


def merged(cfg: SamplerConfig, length: int) -> list[Slot]:
    """Reference: draw j of suite i at time (j + 1/2) / w_i, merged with a heap, ties to the first suite."""
    heap = [(Fraction(1, 2) / Fraction(str(s.weight)), i, 0) for i, s in enumerate(cfg.suites)]
    heapq.heapify(heap)
    out: list[Slot] = []
    while heap and len(out) < length:
        _, i, j = heapq.heappop(heap)
        s = cfg.suites[i]
        epoch, pos = divmod(j, s.n_tasks)
        out.append(Slot(s.suite_id, permutation(cfg.seed, s.suite_id, epoch, s.n_tasks)[pos], epoch))
        if cfg.epochs is None or j + 1 < cfg.epochs * s.n_tasks:
            heapq.heappush(heap, ((j + Fraction(3, 2)) / Fraction(str(s.weight)), i, j + 1))
    return out


def test_slot_k_is_the_kth_draw_of_the_merged_divisor_sequences():
    # 0.1 : 0.2 : 0.3 ties often; 3 tasks at weight 0.3 finish their epochs long before the others.
    cfg = config(("a", 7, 0.1), ("b", 5, 0.2), ("c", 3, 0.3), ("d", 11, 0.25), epochs=3, seed=5)
    sched = Schedule(cfg)
    assert [sched.slot(k) for k in range(len(sched))] == merged(cfg, 10**6)
    endless = config(("a", 4, 1.5), ("b", 9, 1.0), seed=2)
    assert [Schedule(endless).slot(k) for k in range(500)] == merged(endless, 500)


def test_every_prefix_holds_each_suites_weighted_share_to_within_one():
    cfg = config(("x", 13, 1.0), ("y", 50, 2.0), ("z", 7, 0.5))
    sched = Schedule(cfg)
    counts: collections.Counter[str] = collections.Counter()
    for k in range(3500):
        counts[sched.slot(k).suite_id] += 1
        for s in cfg.suites:
            assert abs(counts[s.suite_id] - (k + 1) * s.weight / 3.5) <= 1, (k, counts)
    assert counts == {"y": 2000, "x": 1000, "z": 500}


def test_each_epoch_is_a_fresh_permutation_of_the_suite():
    cfg = config(("a", 20, 1.0), ("b", 6, 3.0), epochs=4, seed=11)
    by_epoch = collections.defaultdict(list)
    for slot in (Schedule(cfg).slot(k) for k in range(4 * 26)):
        by_epoch[slot.suite_id, slot.epoch].append(slot.task_index)
    assert sorted(by_epoch) == [(s, e) for s in "ab" for e in range(4)]
    for (suite, _), order in by_epoch.items():
        assert sorted(order) == list(range(20 if suite == "a" else 6))
    a = [tuple(by_epoch["a", e]) for e in range(4)]
    assert len(set(a)) == 4, "suite a is reshuffled every epoch"
    assert all(order != tuple(range(20)) for order in a), "and shuffled at all"


def test_the_order_depends_on_the_seed_alone():
    def order(seed: int) -> list[Slot]:
        s = Schedule(config(("a", 30, 1.0), ("b", 30, 1.0), epochs=1, seed=seed))
        return [s.slot(k) for k in range(len(s))]

    assert order(3) == order(3)
    assert order(3) != order(4)
    # Only the task order changes with the seed; the interleaving of suites does not.
    assert [s.suite_id for s in order(3)] == [s.suite_id for s in order(4)]


def test_the_schedule_ends_exactly_after_every_suite_spent_its_epochs():
    cfg = config(("small", 2, 10.0), ("big", 9, 1.0), epochs=3)
    sched = Schedule(cfg)
    assert len(sched) == 33
    slots = [sched.slot(k) for k in range(33)]
    assert collections.Counter((s.suite_id, s.task_index) for s in slots) == {
        **{("small", t): 3 for t in range(2)},
        **{("big", t): 3 for t in range(9)},
    }
    # The heavy small suite is done after its 6 draws; the rest of the schedule is "big" alone.
    last_small = max(k for k, s in enumerate(slots) if s.suite_id == "small")
    assert last_small < 8 and all(s.suite_id == "big" for s in slots[last_small + 1 :])
    with pytest.raises(IndexError):
        sched.slot(33)
    assert sched.exhausted(33) and not sched.exhausted(32)
    with pytest.raises(TypeError):
        len(Schedule(config(("a", 2, 1.0))))


def test_config_round_trips_and_rejects_nonsense():
    cfg = config(("calc@abc", 5, 0.7), ("qa@def", 3, 1.0), epochs=2, seed=9)
    assert SamplerConfig.from_json(cfg.to_json()) == cfg
    for bad in (
        [("a", 0, 1.0)],
        [("a", 1, 0.0)],
        [("a", 1, float("inf"))],
        [("a", 1, 1.0), ("a", 2, 1.0)],
        [],
    ):
        with pytest.raises(ValueError):
            config(*bad)
    with pytest.raises(ValueError):
        config(("a", 1, 1.0), epochs=0)


# ---------------------------------------------------------------- in Redis

CALC_A, CALC_B = calc_suite(60, seed=21), calc_suite(40, seed=22)


async def configured(
    url: str, run: str, *, epochs: int | None = 2, seed: int = 1, grow: bool = False
) -> SamplerConfig:
    suites = SuiteStore(url)
    try:
        return await suites.configure_sampler(
            run, [WeightedSuite(CALC_A, 1.0), WeightedSuite(CALC_B, 2.0)], epochs=epochs, seed=seed,
            grow_epochs=grow,
        )  # fmt: skip
    finally:
        await suites.aclose()


def named(sampler: RunSampler, k: int) -> tuple[str, str, int]:
    t = sampler.task(k)
    return t["suite"], t["task_id"], t["epoch"]


async def test_concurrent_managers_never_claim_the_same_slot(redis_server):
    await configured(redis_server.url, "shared")  # 2 epochs of 60 + 40 tasks: 200 slots
    stores = [TrajectoryStore(redis_server.url, "shared") for _ in range(2)]  # two "machines"
    try:
        samplers = [await RunSampler.load(s) for s in stores]
        claimed: list[tuple[int, int, str, dict]] = []

        async def worker(m: int, w: int) -> None:
            sampler = samplers[m]
            while (entry := await sampler.claim("rollout", f"m{m}-w{w}")) is not None:
                claimed.append((m, entry.task["slot"], entry.entry_id, entry.task))
                await sampler.store.tasks.ack("rollout", [entry.entry_id])

        await asyncio.gather(*(worker(m, w) for m in range(2) for w in range(4)))
        assert sorted(slot for _, slot, _, _ in claimed) == list(range(200))
        assert len({eid for _, _, eid, _ in claimed}) == 200
        assert {m for m, *_ in claimed} == {0, 1}, "both managers took part"
        for _, slot, _, task in claimed:
            assert (task["suite"], task["task_id"], task["epoch"]) == named(samplers[0], slot)
        assert await stores[0].sampler.position() == 200
        assert await stores[0].tasks.take("rollout", "late", count=10) == [], "nothing left behind"
    finally:
        for s in stores:
            await s.close()


async def test_a_resumed_run_continues_at_the_saved_position(redis_server):
    cfg = await configured(redis_server.url, "first", epochs=None)
    first = TrajectoryStore(redis_server.url, "first")
    resumed = TrajectoryStore(redis_server.url, "again")  # e.g. a new Redis: only the checkpoint is left
    try:
        sampler = await RunSampler.load(first)
        handed = [(await sampler.claim("rollout", "m")).task for _ in range(11)]
        saved = 10  # the checkpoint was taken after ten claims
        assert await configured(redis_server.url, "first", epochs=None) == cfg, "same config: a no-op"
        assert await first.sampler.position() == 11
        with pytest.raises(StoreError, match="another task sampler"):
            await configured(redis_server.url, "first", epochs=3)

        await configured(redis_server.url, "again", epochs=None)
        await resumed.sampler.set_position(saved)
        restarted = await RunSampler.load(resumed)
        entry = await restarted.claim("rollout", "m2")
        assert entry.task == handed[10], "the 11th task of the same schedule"
        assert (await resumed.sampler.get()).position == 11
    finally:
        await first.close()
        await resumed.close()


async def test_a_dead_managers_claim_is_reclaimed_and_submitted_tasks_go_first(redis_server):
    await configured(redis_server.url, "r")
    suites = SuiteStore(redis_server.url)
    store = TrajectoryStore(redis_server.url, "r")
    try:
        sampler = await RunSampler.load(store)
        lost = await sampler.claim("rollout", "dead-manager")
        await asyncio.sleep(0.05)
        (again,) = await store.tasks.reclaim("rollout", "alive", min_idle_ms=20, count=5)
        assert (again.entry_id, again.task) == (lost.entry_id, lost.task) and lost.task["slot"] == 0

        await suites.submit(calc_suite(1, seed=99), "r")
        first = await sampler.claim("rollout", "alive")
        assert first.task["task_id"] == "calc-99-0" and "slot" not in first.task
        (waiting,) = await store.tasks.take("rollout", "alive", count=5)
        assert waiting.task["slot"] == 1, "the slot claimed meanwhile waits in the queue, not lost"
    finally:
        await suites.aclose()
        await store.close()
    async with TrajectoryStore(redis_server.url, "no-sampler") as plain:
        assert await RunSampler.load(plain) is None


# ---------------------------------------------------------------- skipping tasks without signal


@pytest.mark.parametrize(
    ("flat", "skipped", "skip_flat", "gives_up"),
    [(0, 0, 2, False), (1, 0, 2, True), (3, 1, 2, True), (1, 2, 2, False), (1, 0, 0, False)],
)
def test_a_flat_task_gives_up_skip_flat_draws_then_runs_again(flat, skipped, skip_flat, gives_up):
    assert skips(flat, skipped, skip_flat) is gives_up


def test_skip_flat_is_stored_with_the_config_only_when_on():
    off, on = config(("a", 3, 1.0), epochs=2), SamplerConfig((SuiteShare("a", 3, 1.0),), 2, 0, 2)
    assert "skip_flat" not in off.to_json(), "a run configured before skipping existed reads the same"
    assert SamplerConfig.from_json(on.to_json()) == on and SamplerConfig.from_json(off.to_json()) == off
    with pytest.raises(ValueError, match="skip_flat"):
        SamplerConfig((SuiteShare("a", 3, 1.0),), 2, 0, -1)


async def test_a_task_without_signal_gives_up_its_next_draws_and_returns(redis_server):
    """Three tasks, five epochs, skip_flat 2. Task 0 is always flat (solved by every episode): after
    its first group it gives up the next two epochs' draws, runs in the fourth, gives up the fifth.
    The others always carry signal and run every epoch. The skipped slots pass without a lease."""
    suite = calc_suite(3, seed=31, shots=0)
    suites = SuiteStore(redis_server.url)
    store = TrajectoryStore(redis_server.url, "skip")
    try:
        await suites.configure_sampler("skip", [WeightedSuite(suite)], epochs=5, seed=2, skip_flat=2)
        sampler = await RunSampler.load(store)
        ran: list[tuple[str, int]] = []
        while (entry := await sampler.claim("rollout", "m")) is not None:
            t = entry.task
            ran.append((t["task_id"], t["epoch"]))
            flat = t["task_id"] == suite.tasks[0].id
            await sampler.record(t, [1.0, 1.0] if flat else [0.0, 1.0])
            await store.tasks.ack("rollout", [entry.entry_id])
        epochs = collections.defaultdict(list)
        for task_id, epoch in ran:
            epochs[task_id].append(epoch)
        assert epochs == {suite.tasks[0].id: [0, 3], suite.tasks[1].id: [0, 1, 2, 3, 4],
                          suite.tasks[2].id: [0, 1, 2, 3, 4]}  # fmt: skip
        assert await store.sampler.position() == 15, "the whole schedule was walked"
        assert await store.tasks.take("rollout", "late", count=10) == [], "skipped slots queued nothing"
        seen = await store.sampler.outcome(task_key(queued_task(suite, 0)))
        assert seen == TaskOutcome(flat=2, skipped=1), "flat twice in a row; one draw given up since"
    finally:
        await suites.aclose()
        await store.close()


async def test_derived_epochs_grow_on_resume_and_keep_the_schedule(redis_server):
    """A job whose epochs come from its step budget may resume with a larger budget: the sampler
    keeps its position and gains the epochs; nothing else may change, and set epochs never do."""
    await configured(redis_server.url, "grow", epochs=1, grow=True)
    store = TrajectoryStore(redis_server.url, "grow")
    try:
        sampler = await RunSampler.load(store)
        first = (await sampler.claim("rollout", "m")).task
        assert (await configured(redis_server.url, "grow", epochs=3, grow=True)).epochs == 3
        assert (await configured(redis_server.url, "grow", epochs=2, grow=True)).epochs == 3, "never shrinks"
        grown = await RunSampler.load(store)
        assert named(grown, 299)[2] == 2 and await store.sampler.position() == 1
        assert (await grown.claim("rollout", "m")).task["slot"] == 1 != first["slot"]
        # a worker that loaded the first plan (a rollout worker outliving its trainer) follows the
        # grown one: it goes on past the first plan's 100 slots, drawing what the trainer draws
        await store.sampler.set_position(99)
        assert (await sampler.claim("rollout", "m")).task == grown.task(99)
        assert (await sampler.claim("rollout", "m")).task["slot"] == 100
        with pytest.raises(StoreError, match="another task sampler"):
            await configured(redis_server.url, "grow", epochs=3, seed=2, grow=True)
        with pytest.raises(StoreError, match="another task sampler"):
            await configured(redis_server.url, "grow", epochs=4)  # epochs the user set: as given
    finally:
        await store.close()
