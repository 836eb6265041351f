"""The run's policy version: published atomically, only growing."""

from __future__ import annotations

import asyncio

import pytest

from pqrl.store import StoreError


async def test_policy_versions_only_grow(store):
    policy = store.policy
    assert (await policy.get()).version == 0 and (await policy.get()).weights is None
    versions = await asyncio.gather(*(policy.publish(f"/w/{i}") for i in range(20)))
    assert sorted(versions) == list(range(1, 21))
    assert await policy.publish("/w/resumed", version=100) == 100
    with pytest.raises(StoreError, match="not above the current 100"):
        await policy.publish("/w/old", version=50)
    state = await policy.get()
    assert state.version == 100 and state.weights == "/w/resumed"
