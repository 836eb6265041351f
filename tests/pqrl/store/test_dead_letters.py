"""Corrupt group entries go to the dead letters, kept with the reason and the original bytes."""

from __future__ import annotations

from tests.conftest import make_group


async def test_corrupt_entry_goes_to_dead_letters_and_the_rest_is_delivered(store):
    groups = store.groups
    await groups.create_consumer_group("trainer")
    good1 = await groups.put(make_group("g1"))
    bad_id = (await store.redis.xadd(groups.key, {"group": b"PQT\x02garbage"})).decode()
    bad_n = (await store.redis.xadd(groups.key, {"n": 2, "0": b"x"})).decode()
    good2 = await groups.put(make_group("g2"))
    entries = await groups.read("trainer", "t0", count=10)
    assert [e.entry_id for e in entries] == [good1, good2]
    dead = dict(await store.dead_letters.list())
    assert set(dead) == {bad_id, bad_n}
    assert "runs past" in dead[bad_id] or "tokens need" in dead[bad_id]
    assert "expected only b'group'" in dead[bad_n]
    raw = await store.redis.xrange(store.dead_letters.key)
    assert raw[0][1][b"field:group"] == b"PQT\x02garbage"  # the original bytes are kept for inspection
    await groups.ack("trainer", [good1, good2])
    assert await groups.backlog() == 0
