"""The client's cost of one put, per group, against a raw XADD of a ready blob, in one run.

Three ways of appending the same 250 groups (8 x 4,096 tokens each) to a stream, alternated ROUNDS
times in turn after one untimed round, on a private redis-server (appendfsync no: only the client
is measured):

  (a) raw:     XADD of the blobs, encoded beforehand (the floor: the send alone),
  (b) put:     ``GroupStream.put``, which encodes each group into parts (``pqrl.codec.encode_parts``)
               and sends them without joining them first (``pqrl.store.parts``),
  (c) joined:  XADD of ``encode_many(group)``, a fresh blob per group, as the store's put did before.

For each, the median over rounds of the client's user and system CPU microseconds and minor page
faults per group. ``bench/store.py`` measures the whole round trip (put, read, ack) instead, where
the client's share is lost in the server's noise.
Prints one JSON line: {way: {"user_us", "sys_us", "cpu_us", "faults"}}.
Usage: python bench/store_put.py [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.store import make_trajectories  # noqa: E402
from pqrl.codec import encode_many  # noqa: E402
from pqrl.redis_server import RedisServer  # noqa: E402
from pqrl.store import TrajectoryStore  # noqa: E402


async def main(rounds: int) -> dict[str, dict[str, float]]:
    groups = make_trajectories(2000, 4096)
    blobs = [encode_many(g) for g in groups]
    with RedisServer(appendfsync="no") as server:
        async with TrajectoryStore(server.url, "bench", max_backlog=0) as store:
            r = store.redis

            async def raw() -> None:
                for blob in blobs:
                    await r.xadd("raw", {"group": blob})

            async def put() -> None:
                for g in groups:
                    await store.groups.put(g)

            async def joined() -> None:
                for g in groups:
                    await r.xadd("joined", {"group": encode_many(g)})

            ways = {"raw": raw, "put": put, "joined": joined}
            samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
            for k in range(rounds + 1):
                for name in list(ways) if k % 2 else list(ways)[::-1]:
                    await r.flushall()
                    before = resource.getrusage(resource.RUSAGE_SELF)
                    await ways[name]()
                    after = resource.getrusage(resource.RUSAGE_SELF)
                    if k:  # round 0 warms the allocator, the connection and the pages
                        n = len(groups)
                        samples[name].append(
                            (
                                (after.ru_utime - before.ru_utime) / n * 1e6,
                                (after.ru_stime - before.ru_stime) / n * 1e6,
                                (after.ru_minflt - before.ru_minflt) / n,
                            )
                        )
                print(f"round {k} done", file=sys.stderr)
    return {name: _medians(s) for name, s in samples.items()}


def _medians(s: list[tuple[float, float, float]]) -> dict[str, Any]:
    user, system, faults = (statistics.median(x[i] for x in s) for i in range(3))
    cpu = statistics.median(x[0] + x[1] for x in s)
    return {"user_us": round(user), "sys_us": round(system), "cpu_us": round(cpu), "faults": round(faults, 1)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    print(json.dumps(asyncio.run(main(ap.parse_args().rounds))))
