"""Trajectory store throughput: binary codec vs JSON lists vs raw Redis, in one run.

Writes and reads back 2,000 trajectories of 4,096 tokens (groups of 8) through a consumer group,
acknowledging each batch, on a private redis-server (appendfsync everysec for all three):

  (a) the store with the binary codec (encode, XADD + XLEN for back-pressure, XREADGROUP,
      decode + validation, Lua ack + trim),
  (b) the same store with the codec swapped for JSON lists,
  (c) raw XADD / XREADGROUP / XACK of opaque blobs of the same byte size (one per entry, as the
      store writes one blob per group): the ceiling.

(a) and (c) are measured ROUNDS times interleaved, alternating which goes first, after one untimed
round of each (the machine is noisy). fraction_of_raw is the median over rounds of (a)/(c) within
the round, which follows the load as it drifts better than a ratio of medians; traj_per_s and
raw_redis_per_s are the medians. Redis rewrites its append-only file between phases instead of when
it has grown enough: an automatic rewrite forks and writes the whole dataset, and landing in one
phase or the other at random it was the largest source of noise.
Prints one JSON line: traj_per_s, json_traj_per_s, raw_redis_per_s, ratio_vs_json, fraction_of_raw,
fraction_per_round (to show the spread), us_per_group (where the time goes: for each side and each
kind of call, put / read / ack, the median over rounds of [wall, CPU] microseconds per group; the
store's put includes encoding, its read decoding and checking, its ack trimming) and
codec_cpu_us_per_group (encode_parts and decode_many alone, each group visited once) and
cpu_us_per_group (for each side, the median over rounds of [client, server] CPU microseconds per group
over the whole phase: the client's process time and redis-server's, from INFO cpu; the server's
includes the trim's freeing on the store side, which the raw side never does inside its phase).
Usage: python bench/store.py [--trajectories N] [--tokens T] [--rounds R] [--group-size G] [--batch B]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pqrl.store.groups
from pqrl.codec import decode_many, encode_many, encode_parts
from pqrl.redis_server import RedisServer
from pqrl.store import TrajectoryStore
from pqrl.trajectory import Trajectory, Turn

GROUP = 8  # trajectories per stream entry (a GRPO group); --group-size
BATCH = 16  # entries per XREADGROUP; --batch


def make_trajectories(n: int, T: int, seed: int = 0) -> list[list[Trajectory]]:
    rng = np.random.default_rng(seed)
    prompt = 512
    groups = []
    for g in range(n // GROUP):
        group = []
        for i in range(GROUP):
            generated = np.zeros(T, np.uint8)
            generated[prompt:] = 1
            generated[prompt + 1000 : prompt + 1400] = 0  # a tool observation
            group.append(
                Trajectory(
                    id=f"g{g}-{i}",
                    run_id="bench",
                    task_id=f"t{g}",
                    group_id=f"g{g}",
                    env="calc-v1",
                    tokens=rng.integers(0, 49152, T, dtype=np.int32),
                    generated=generated,
                    loss_mask=generated.copy(),
                    behavior_logprobs=np.where(generated == 1, -rng.random(T, dtype=np.float32), 0).astype(
                        np.float32
                    ),
                    versions=np.where(generated == 1, 5, -1).astype(np.int32),
                    prompt_len=prompt,
                    turns=(Turn(prompt, prompt + 1000), Turn(prompt + 1400, T)),
                    reward=float(i % 2),
                    reward_info={"exact": bool(i % 2)},
                )
            )
        groups.append(group)
    return groups


_ARRAYS = ("tokens", "generated", "loss_mask", "behavior_logprobs", "versions")


def json_encode_many(ts: list[Trajectory]) -> bytes:
    out = []
    for t in ts:
        d = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}
        d.update({k: d[k].tolist() for k in _ARRAYS})
        d["turns"] = [dataclasses.asdict(u) for u in t.turns]
        d["truncation"] = None
        out.append(d)
    return json.dumps(out).encode()


def json_decode_many(blob: bytes) -> list[Trajectory]:
    out = []
    for d in json.loads(blob):
        d["turns"] = tuple(Turn(**u) for u in d["turns"])
        out.append(Trajectory(**d))
    return out


class Phases:
    """Wall and CPU seconds spent in each kind of call (put, read, ack), summed over a round, and
    the CPU seconds of the whole phase on each side of the socket (``whole``: client, server)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.whole: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        w, c = time.perf_counter(), time.process_time()
        yield
        self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
        self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c


async def through_store(url: str, groups: list[list[Trajectory]], run: str, phase: Phases) -> float:
    async with TrajectoryStore(url, run, max_backlog=0) as store:
        await store.groups.create_consumer_group("trainer")
        t0 = time.perf_counter()
        for g in groups:
            with phase("put"):
                await store.groups.put(g)
        got = 0
        while True:
            with phase("read"):
                entries = await store.groups.read("trainer", "c", count=BATCH)
            if not entries:
                break
            got += sum(len(e.trajectories) for e in entries)
            with phase("ack"):
                await store.groups.ack("trainer", [e.entry_id for e in entries])
        dt = time.perf_counter() - t0
        assert got == len(groups) * GROUP and await store.groups.backlog() <= 1
        await store.redis.flushall()
    return got / dt


async def raw_redis(url: str, blobs: list[bytes], run: str, phase: Phases) -> float:
    r = aioredis.Redis.from_url(url)
    key = f"raw:{run}"
    await r.xgroup_create(key, "trainer", id="0", mkstream=True)
    t0 = time.perf_counter()
    for blob in blobs:
        with phase("put"):
            await r.xadd(key, {"group": blob})
    got = 0
    while True:
        with phase("read"):
            reply = await r.xreadgroup("trainer", "c", {key: ">"}, count=BATCH)
        if not reply or not reply[0][1]:
            break
        entries = reply[0][1]
        got += len(entries) * GROUP
        with phase("ack"):
            await r.xack(key, "trainer", *[i for i, _ in entries])
    dt = time.perf_counter() - t0
    assert got == len(blobs) * GROUP
    await r.flushall()
    await r.aclose()
    return got / dt


async def rewrite_aof(url: str) -> None:
    """Rewrites the append-only file now (the dataset is empty between phases) and waits for it;
    automatic rewrites are turned off, so none starts inside a phase."""
    r = aioredis.Redis.from_url(url)
    await r.config_set("auto-aof-rewrite-percentage", 0)
    await aof_idle(r)  # one started before the setting took effect
    await r.bgrewriteaof()
    await aof_idle(r)
    await r.aclose()


async def aof_idle(r: aioredis.Redis) -> None:
    while (info := await r.info("persistence"))["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"]:
        await asyncio.sleep(0.05)


async def one_round(
    url: str, groups: list[list[Trajectory]], blobs: list[bytes], k: int
) -> tuple[dict[str, float], dict[str, Phases]]:
    """Rates and phases of round ``k``, by side (store, raw); odd rounds run the store first."""
    rates, phases = {}, {"store": Phases(), "raw": Phases()}
    for name in ("raw", "store") if k % 2 == 0 else ("store", "raw"):
        await rewrite_aof(url)
        async with cpu_spent(url, phases[name].whole):
            rates[name] = await (
                raw_redis(url, blobs, f"r{k}", phases[name])
                if name == "raw"
                else through_store(url, groups, "bench", phases[name])
            )
    return rates, phases


@contextlib.asynccontextmanager
async def cpu_spent(url: str, into: dict[str, float]) -> AsyncIterator[None]:
    """Sets ``into["client"]`` and ``into["server"]``: this process's and redis-server's CPU
    seconds while the block ran."""
    client, server = time.process_time(), await server_cpu_s(url)
    yield
    into["client"] = time.process_time() - client
    into["server"] = await server_cpu_s(url) - server


async def server_cpu_s(url: str) -> float:
    """redis-server's user + system CPU seconds so far."""
    r = aioredis.Redis.from_url(url)
    info = await r.info("cpu")
    await r.aclose()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def codec_us(groups: list[list[Trajectory]], blobs: list[bytes]) -> dict[str, float]:
    """CPU microseconds per group to encode (into parts, as the store sends) and to decode, each
    group visited once (cold, as in the store)."""
    out = {}
    for name, fn, items in (("encode_parts", encode_parts, groups), ("decode_many", decode_many, blobs)):
        t0 = time.process_time()
        for x in items:
            fn(x)
        out[name] = round((time.process_time() - t0) / len(items) * 1e6, 1)
    return out


def per_group_us(phases: list[Phases], groups: int) -> dict[str, dict[str, list[float]]]:
    """Median over rounds of each phase's [wall, cpu] microseconds per group."""
    return {
        name: [
            round(statistics.median(getattr(p, kind)[name] for p in phases) / groups * 1e6)
            for kind in ("wall", "cpu")
        ]
        for name in phases[0].wall
    }


async def main(n: int, T: int, rounds: int) -> dict[str, Any]:
    groups = make_trajectories(n, T)
    blobs = [encode_many(g) for g in groups]
    print(f"{n} trajectories x {T} tokens, groups of {GROUP} in {len(blobs[0])}-byte blobs", file=sys.stderr)
    with RedisServer(appendfsync="everysec") as server:
        await one_round(server.url, groups, blobs, -1)  # warm-up: allocator, connections, scripts
        store_rates, raw_rates = [], []
        phases: dict[str, list[Phases]] = {"store": [], "raw": []}
        for k in range(rounds):
            rates, by_side = await one_round(server.url, groups, blobs, k)
            store, raw = rates["store"], rates["raw"]
            store_rates.append(store)
            raw_rates.append(raw)
            for side, p in by_side.items():
                phases[side].append(p)
            print(f"round {k}: store {store:.0f}/s raw {raw:.0f}/s", file=sys.stderr)
        await rewrite_aof(server.url)
        with (
            mock.patch.object(pqrl.store.groups, "encode_parts", lambda ts: [json_encode_many(ts)]),
            mock.patch.object(pqrl.store.groups, "decode_many", json_decode_many),
        ):
            json_rate = await through_store(server.url, groups, "bench", Phases())
        print(f"json {json_rate:.0f}/s", file=sys.stderr)
    traj, raw = statistics.median(store_rates), statistics.median(raw_rates)
    fractions = [a / c for a, c in zip(store_rates, raw_rates, strict=True)]
    return {
        "traj_per_s": round(traj, 1),
        "json_traj_per_s": round(json_rate, 1),
        "raw_redis_per_s": round(raw, 1),
        "ratio_vs_json": round(traj / json_rate, 2),
        "fraction_of_raw": round(statistics.median(fractions), 3),
        "fraction_per_round": [round(f, 3) for f in fractions],
        "us_per_group": {side: per_group_us(p, len(groups)) for side, p in phases.items()},
        "codec_cpu_us_per_group": codec_us(groups, blobs),
        "cpu_us_per_group": {
            side: [
                round(statistics.median(x.whole[end] for x in p) / len(groups) * 1e6)
                for end in ("client", "server")
            ]
            for side, p in phases.items()
        },
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--group-size", type=int, default=GROUP, help="trajectories per stream entry")
    ap.add_argument("--batch", type=int, default=BATCH, help="entries per XREADGROUP")
    a = ap.parse_args()
    GROUP, BATCH = a.group_size, a.batch
    print(json.dumps(asyncio.run(main(a.trajectories, a.tokens, a.rounds))))
