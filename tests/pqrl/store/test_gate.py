"""The staleness gate: admits within the budget, frees on progress, never over-admits."""

from __future__ import annotations

import asyncio

from pqrl.staleness import within_staleness
from pqrl.store import TrajectoryStore


async def test_admission_stays_within_the_staleness_budget_and_frees_on_progress(store):
    gate = store.gate
    limits = {"holder": "m1", "max_concurrent": 3, "max_staleness": 1, "groups_per_step": 2}
    # version 0: (1 + 0 + 1) * 2 = 4 groups may be accepted or running, at most 3 at once
    assert [await gate.admit(**limits) for _ in range(4)] == [True, True, True, False]
    await gate.finish(holder="m1", accepted=True)
    assert await gate.admit(**limits)  # 3 running + 1 accepted = 4: the budget is now full
    await gate.finish(holder="m1", accepted=True)
    assert not await gate.admit(**limits), "2 accepted + 2 running is the budget at version 0"
    await store.policy.publish("/w/1")  # the trainer took a step: version 1 adds groups_per_step
    assert await gate.admit(**limits)
    assert await gate.state() == {"accepted": 2, "running": 3, "rejected": 0}
    await gate.finish(holder="m1", accepted=False)  # a dropped group frees its place
    await gate.reject(2)  # the trainer dropped two accepted groups
    assert await gate.state() == {"accepted": 0, "running": 2, "rejected": 3}
    await gate.reset(groups_per_step=2)
    assert await gate.state() == {"accepted": 2, "running": 0, "rejected": 3}


async def test_the_gate_admits_exactly_the_groups_the_staleness_rule_lets_train(redis_server):
    """The trainer takes groups in order, ``groups_per_step`` per version, so the n-th group
    accepted (from 0) trains at version n // groups_per_step; admitted at the published version, its
    first token is of that version. The Lua budget must admit a group exactly when
    ``within_staleness`` would let it train: the last admitted on one side, the first refused on
    the other."""
    for max_staleness, per_step, version in [(0, 1, 0), (1, 2, 0), (2, 3, 3), (1, 4, 5), (3, 1, 2)]:
        store = TrajectoryStore(redis_server.url, f"s{max_staleness}-p{per_step}-v{version}")
        try:
            if version:
                await store.policy.publish("/w", version=version)
            await store.gate.reset(groups_per_step=per_step)  # the earlier versions' groups trained
            limits = {"max_concurrent": 1000, "max_staleness": max_staleness, "groups_per_step": per_step}
            admitted = 0
            while await store.gate.admit(holder="m", **limits):
                admitted += 1
            first_refused = version * per_step + admitted
            assert admitted > 0 and within_staleness(version, (first_refused - 1) // per_step, max_staleness)
            assert not within_staleness(version, first_refused // per_step, max_staleness)
        finally:
            await store.close()


async def test_a_trainer_joining_live_workers_keeps_their_places(store):
    """Workers admitted groups before the trainer started: a reset must not zero what they hold, or
    their finishes drive ``running`` below zero and the gate admits past the staleness bound."""
    gate = store.gate
    limits = {"holder": "m1", "max_concurrent": 2, "max_staleness": 0, "groups_per_step": 2}
    assert [await gate.admit(**limits) for _ in range(3)] == [True, True, False]
    await gate.finish(holder="m1", accepted=True)
    await gate.reset(groups_per_step=2, live_managers=True)
    assert await gate.state() == {"accepted": 1, "running": 1, "rejected": 0}
    await gate.finish(holder="m1", accepted=True)
    assert await gate.state() == {"accepted": 2, "running": 0, "rejected": 0}
    assert not await gate.admit(**limits), "the budget of version 0 is spent"
    await store.policy.publish("/w/1")
    await store.policy.publish("/w/2")
    await gate.reset(groups_per_step=2, live_managers=True)  # a resumed trainer serves version 2
    assert (await gate.state())["accepted"] == 4, "accepted rises to version x groups_per_step"


async def test_gate_never_over_admits_under_concurrency(store):
    limits = {"holder": "m1", "max_concurrent": 100, "max_staleness": 0, "groups_per_step": 5}
    results = await asyncio.gather(*(store.gate.admit(**limits) for _ in range(40)))
    assert sum(results) == 5


async def test_a_silent_holders_places_come_back_and_its_late_ends_count_nothing(store):
    """A worker killed mid-group never ends its groups: once it stops beating, the next admission
    gives its places back (else each kill would shrink the gate for good and stall the run). If it
    was only stalled, its late ends find no places left and change nothing."""
    gate = store.gate
    limits = {"max_concurrent": 4, "max_staleness": 0, "groups_per_step": 4}
    assert [await gate.admit(holder="dead", ttl_ms=200, **limits) for _ in range(3)] == [True] * 3
    assert await gate.admit(holder="live", **limits)
    assert not await gate.admit(holder="live", **limits), "4 places held: the budget of version 0"
    await asyncio.sleep(0.3)  # "dead" stopped beating
    assert await gate.state() == {"accepted": 0, "running": 1, "rejected": 0}
    assert [await gate.admit(holder="live", **limits) for _ in range(4)] == [True, True, True, False]
    await gate.finish(holder="dead", accepted=True)  # a stalled holder comes back late
    await gate.release(holder="dead")
    assert await gate.state() == {"accepted": 0, "running": 4, "rejected": 0}
    await gate.beat("live")
    await gate.finish(holder="live", accepted=True)
    assert await gate.state() == {"accepted": 1, "running": 3, "rejected": 0}
