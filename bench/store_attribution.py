"""Where the store's extra time over raw Redis goes: each codec step's cost inside the round trip.

``bench/store.py``'s round trip (put every group, then read and ack in batches) run five ways,
alternated ROUNDS times after one untimed round, on a private redis-server (appendfsync everysec):

  raw:           XADD / XREADGROUP / XACK of ready blobs (bench/store.py's ceiling),
  store:         the store as it is,
  no_decode:     the store with decode_many replaced by returning one ready group,
  no_encode:     the store with encode_parts replaced by looking up parts encoded beforehand,
  neither:       both replaced: what the store costs besides its codec.

A step's cost in the loop (``store`` minus ``no_decode``, say) also counts what it brings along:
freeing the records it made, the garbage collector, the blob kept alive by the records' views.
Those are counted against it here, where ``bench/store.py``'s codec_cpu_us_per_group times the
step alone. For each way, the median over rounds of the client's and redis-server's CPU
microseconds per group (process time; INFO cpu) and the client's minor page faults per group.
Prints one JSON line: {way: {"client_us", "server_us", "faults"}}.
Usage: python bench/store_attribution.py [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pqrl.store.groups  # noqa: E402
from bench.store import Phases, cpu_spent, make_trajectories, raw_redis, rewrite_aof, through_store  # noqa: E402
from pqrl.codec import decode_many, encode_many, encode_parts  # noqa: E402
from pqrl.redis_server import RedisServer  # noqa: E402
from pqrl.trajectory import Trajectory  # noqa: E402


async def main(rounds: int) -> dict[str, dict[str, float]]:
    groups = make_trajectories(2000, 4096)
    blobs = [encode_many(g) for g in groups]
    parts = {id(g): encode_parts(g) for g in groups}
    ready = decode_many(blobs[0])

    def encode_ready(ts: list[Trajectory]) -> list[Any]:
        return parts[id(ts)]

    def decode_ready(blob: bytes) -> list[Trajectory]:
        return ready

    codecs: dict[str, tuple[Callable[..., Any], Callable[..., Any]] | None] = {
        "raw": None,
        "store": (encode_parts, decode_many),
        "no_decode": (encode_parts, decode_ready),
        "no_encode": (encode_ready, decode_many),
        "neither": (encode_ready, decode_ready),
    }
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in codecs}
    with RedisServer(appendfsync="everysec") as server:
        url = server.url
        for k in range(rounds + 1):
            names = list(codecs)
            for name in names[k % len(names) :] + names[: k % len(names)]:  # each way leads in turn
                await rewrite_aof(url)
                faults, cpu = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, {}
                codec = codecs[name]
                async with cpu_spent(url, cpu):
                    if codec is None:
                        await raw_redis(url, blobs, f"r{k}", Phases())
                    else:
                        with (
                            mock.patch.object(pqrl.store.groups, "encode_parts", codec[0]),
                            mock.patch.object(pqrl.store.groups, "decode_many", codec[1]),
                        ):
                            await through_store(url, groups, "bench", Phases())
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
                if k:  # round 0 warms the allocator, the connections and the scripts
                    n = len(groups)
                    samples[name].append((cpu["client"] / n * 1e6, cpu["server"] / n * 1e6, faults / n))
            print(f"round {k} done", file=sys.stderr)
    return {
        name: {
            key: round(statistics.median(x[i] for x in s), 1 if key == "faults" else None)
            for i, key in enumerate(("client_us", "server_us", "faults"))
        }
        for name, s in samples.items()
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    print(json.dumps(asyncio.run(main(ap.parse_args().rounds))))
