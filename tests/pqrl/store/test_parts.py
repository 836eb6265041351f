"""Values sent as several buffers: the bytes Redis stores are those of the joined value, whatever
the command, alone or in a pipeline, and whatever kind of connection the client uses."""

from __future__ import annotations

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

from pqrl.store.parts import Parts, sends_parts


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
    # Split command names, and two Parts in one command.
    packed = conn.pack_command("CONFIG SET", Parts([b"a", b"b"]), Parts(buffers))
    assert b"".join(packed) == b"".join(conn.pack_command("CONFIG SET", b"ab", joined))
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
