"""Env server benchmark: HTTP step overhead and latency under 200 concurrent sessions.

Starts a real `pqrl env-server` process on loopback and measures, in the same run:

  step_overhead_p50_ms  p50 of an HTTP step of echo-v1's no-op `echo` tool minus the p50 of the
                        same step through the in-process client
  step_p99_ms           p99 step latency with CONCURRENT live sessions, each stepping once per
                        THINK seconds (an agent waits on its model between tool calls), for SECONDS
  saturated_steps_per_s the same sessions stepping back to back: the server's ceiling here
  errors                failed requests in all phases

Prints one JSON line at the end. Usage: python bench/env_server.py [--steps 2000] [--concurrent 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env_server.client import HttpEnvClient, LocalEnvClient
from env_server.types import ToolCall
from pqrl.redis_server import free_port

STEPS_PER_SESSION = 7  # echo-v1 ends after 8 turns
NOOP = [ToolCall(name="echo", arguments={"text": "x"})]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


async def sequential_steps(client, n: int) -> list[float]:
    lat: list[float] = []
    while len(lat) < n:
        s = await client.create_session("echo-v1", {"prompt": "p", "expected": "x"})
        for _ in range(STEPS_PER_SESSION):
            t = time.perf_counter()
            await client.step(s.session_id, NOOP)
            lat.append(time.perf_counter() - t)
        await client.close_session(s.session_id)
    return lat


async def concurrent_steps(
    client: HttpEnvClient, sessions: int, seconds: float, think: float
) -> tuple[list[float], int]:
    lat: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds

    async def worker(offset: float) -> None:
        nonlocal errors
        await asyncio.sleep(offset)
        while time.monotonic() < stop:
            try:
                s = await client.create_session("echo-v1", {"prompt": "p", "expected": "x"})
                for _ in range(STEPS_PER_SESSION):
                    t = time.perf_counter()
                    await client.step(s.session_id, NOOP)
                    lat.append(time.perf_counter() - t)
                    await asyncio.sleep(max(0.0, think - (time.perf_counter() - t)))
                await client.close_session(s.session_id)
            except Exception as e:
                errors += 1
                print(f"error: {e!r}", file=sys.stderr)

    await asyncio.gather(*(worker(think * i / sessions) for i in range(sessions)))
    return lat, errors


async def main(a: argparse.Namespace) -> dict[str, float]:
    port, token = free_port(), "bench-token"
    env = {**os.environ, "PQRL_ENV_TOKEN": token, "PQRL_ENV_MAX_SESSIONS": str(a.concurrent + 8)}
    pqrl = str(Path(sys.executable).parent / "pqrl")
    server = subprocess.Popen([pqrl, "env-server", "--port", str(port)], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as probe:
            for _ in range(200):
                try:
                    if (await probe.get(url + "/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
        local = LocalEnvClient()
        http = HttpEnvClient(url, token=token)
        await sequential_steps(local, 100)  # warm-up
        await sequential_steps(http, 100)
        local_lat = await sequential_steps(local, a.steps)
        http_lat = await sequential_steps(http, a.steps)
        print(
            f"sequential: local p50 {pct(local_lat, 0.5):.3f} ms, http p50 {pct(http_lat, 0.5):.3f} ms",
            file=sys.stderr,
        )
        load_lat, errors = await concurrent_steps(http, a.concurrent, a.seconds, a.think)
        print(
            f"{a.concurrent} concurrent: {len(load_lat)} steps, p50 {pct(load_lat, 0.5):.1f} ms",
            file=sys.stderr,
        )
        t0 = time.monotonic()
        saturated, more_errors = await concurrent_steps(http, a.concurrent, a.saturate_seconds, 0.0)
        saturated_rate = len(saturated) / (time.monotonic() - t0)
        errors += more_errors
        await http.aclose()
        await local.aclose()
    finally:
        server.terminate()
        server.wait(10)
    return {
        "step_overhead_p50_ms": round(pct(http_lat, 0.5) - pct(local_lat, 0.5), 3),
        "http_step_p50_ms": round(pct(http_lat, 0.5), 3),
        "local_step_p50_ms": round(pct(local_lat, 0.5), 3),
        "step_p99_ms": round(pct(load_lat, 0.99), 2),
        "concurrent": a.concurrent,
        "steps_under_load": len(load_lat),
        "saturated_steps_per_s": round(saturated_rate, 1),
        "errors": errors,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--concurrent", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--think", type=float, default=1.0, help="seconds between a session's steps")
    ap.add_argument("--saturate-seconds", type=float, default=10.0)
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
