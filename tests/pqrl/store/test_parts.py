"""Values sent as several buffers: the bytes Redis stores are those of the joined value, whatever
the command, alone or in a pipeline, and whatever kind of connection the client uses."""

from __future__ import annotations

import numpy as np
import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

from pqrl.store import TrajectoryStore
from pqrl.store.groups import GroupStream
from pqrl.store.parts import Parts, packs_parts, sends_parts
from tests.conftest import make_group


def _buffers() -> list:
    rng = np.random.default_rng(0)
    return [
        b"head",
        rng.integers(0, 1 << 30, 3000, dtype=np.int32),
        np.zeros(0, np.float32),
        b"",
        rng.random(7),
    ]


def test_packing_frames_parts_as_the_joined_value_would_be():
    buffers = _buffers()
    joined = b"".join(buffers)
    conn = sends_parts(aioredis.Redis()).connection_pool.make_connection()
    packed = conn.pack_command("XADD", "key", "*", "group", Parts(buffers), "n", 7)
    assert b"".join(packed) == b"".join(conn.pack_command("XADD", "key", "*", "group", joined, "n", 7))
    # Split command names, given as str or bytes, and two Parts in one command.
    for name in ("CONFIG SET", b"CONFIG SET"):
        packed = conn.pack_command(name, Parts([b"a", b"b"]), Parts(buffers))
        assert b"".join(packed) == b"".join(conn.pack_command(name, b"ab", joined))
    # The arrays travel as views of their own memory, not as copies.
    assert any(isinstance(c, memoryview) and np.shares_memory(c, buffers[1]) for c in packed)


def test_every_kind_of_connection_learns_parts():
    for url, base in [
        ("redis://127.0.0.1:1", Connection),
        ("rediss://127.0.0.1:1", SSLConnection),
        ("unix:///tmp/none.sock", UnixDomainSocketConnection),
    ]:
        pool = sends_parts(aioredis.Redis.from_url(url)).connection_pool
        assert issubclass(pool.connection_class, base), url
        assert pool.connection_class.__name__ == base.__name__
        assert (
            sends_parts(aioredis.Redis.from_url(url)).connection_pool.connection_class
            is pool.connection_class
        )


async def test_redis_stores_the_joined_bytes_alone_and_in_a_pipeline(redis_server):
    buffers = _buffers()
    joined = b"".join(buffers)
    r = sends_parts(aioredis.Redis.from_url(redis_server.url))
    try:
        await r.set("plain", Parts(buffers))
        entry = await r.xadd("stream", {"group": Parts(buffers), "n": 1})
        async with r.pipeline(transaction=False) as pipe:
            pipe.set("piped", Parts(buffers))
            pipe.xadd("stream", {"group": Parts([b"x", *buffers])})
            pipe.get("piped")
            _, second, piped = await pipe.execute()
        assert await r.get("plain") == joined and piped == joined
        (_, first), (_, other) = await r.xrange("stream")
        assert first == {b"group": joined, b"n": b"1"} and other == {b"group": b"x" + joined}
        assert await r.xlen("stream") == 2 and entry != second
    finally:
        await r.aclose()


async def test_a_client_that_already_connected_is_refused_and_a_stream_on_it_still_puts(redis_server):
    r = aioredis.Redis.from_url(redis_server.url)
    try:
        await r.ping()
        with pytest.raises(ValueError, match="before it opens a connection"):
            sends_parts(r)
        assert not packs_parts(r)
        # A group stream on a client that does not take Parts sends each blob joined instead.
        async with TrajectoryStore(redis_server.url, "run1", max_backlog=0) as store:
            plain = GroupStream(
                r, store.keys, store.url_redacted, dead_letters=store.dead_letters, max_backlog=0
            )
            await plain.put(make_group("g0"))
            await store.groups.put(make_group("g1"))
            assert packs_parts(store.redis)
            assert [g for _, g in await store.groups.peek(2)] == [make_group("g0"), make_group("g1")]
    finally:
        await r.aclose()
