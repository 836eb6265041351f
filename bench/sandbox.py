"""Sandbox benchmark: fast exec vs docker exec, warm-pool acquire latency, churn, and load.

All measured in one run against the local dockerd, with the default hardened settings:

  exec_p50_ms          `true` through the in-container exec agent (one sandbox, sequential)
  docker_exec_p50_ms   `true` through the Engine API's exec (create + start + inspect), same container
  docker_cli_exec_p50_ms  `docker exec CID true` (the CLI, what the 70 ms folklore measures)
  exec_speedup         docker_exec_p50_ms / exec_p50_ms (against the API, the stricter baseline)
  cold_start_p50_ms    create + start + first exec of a new sandbox
  acquire_p99_ms       pool.acquire() while WORKERS rollouts take, use (HOLD s) and release
                       sandboxes continuously for DURATION s
  churn_per_s          sandboxes created and destroyed per second when workers acquire and release
                       as fast as they can
  concurrent           live sandboxes held at once, each running one exec per second
  load_exec_p99_ms / load_errors   exec latency and failures under that load
  mem_per_sandbox_mb   host MemAvailable drop per live sandbox

Prints one JSON line at the end. Usage: python bench/sandbox.py [--duration 60] [--concurrent 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from sandboxes.pool import SandboxPool


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def api_exec(api: DockerAPI, cid: str, argv: list[str]) -> int:
    """One command through the Engine API's exec endpoints: create, start (attached), inspect."""
    r = await api._request(
        "POST", f"/containers/{cid}/exec", json={"Cmd": argv, "AttachStdout": True, "AttachStderr": True}
    )
    eid = r.json()["Id"]
    await api._request("POST", f"/exec/{eid}/start", json={"Detach": False, "Tty": False})
    return (await api._request("GET", f"/exec/{eid}/json")).json()["ExitCode"]


async def exec_latencies(api: DockerAPI, settings: SandboxSettings, n: int) -> dict[str, float]:
    sb = await DockerSandbox.create(api, settings, run="bench")
    try:
        fast, via_api, via_cli = [], [], []
        for _ in range(20):  # warm-up
            await sb.exec("true")
        for _ in range(n):
            t = time.perf_counter()
            await sb.exec(["true"])
            fast.append(time.perf_counter() - t)
        for _ in range(max(20, n // 10)):
            t = time.perf_counter()
            assert await api_exec(api, sb.id, ["true"]) == 0
            via_api.append(time.perf_counter() - t)
        for _ in range(20):
            t = time.perf_counter()
            subprocess.run(["docker", "exec", sb.id, "true"], check=True)
            via_cli.append(time.perf_counter() - t)
    finally:
        await sb.close()
    return {
        "exec_p50_ms": pct(fast, 0.5),
        "exec_p99_ms": pct(fast, 0.99),
        "docker_exec_p50_ms": pct(via_api, 0.5),
        "docker_cli_exec_p50_ms": pct(via_cli, 0.5),
    }


async def cold_starts(api: DockerAPI, settings: SandboxSettings, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        sb = await DockerSandbox.create(api, settings, run="bench")
        await sb.exec("true")
        times.append(time.perf_counter() - t)
        await sb.close()
    return pct(times, 0.5)


async def sustained_acquire(api: DockerAPI, settings: SandboxSettings, *, workers: int, hold: float,
                            duration: float, pool_size: int) -> dict[str, float]:  # fmt: skip
    waits: list[float] = []
    errors = 0
    async with SandboxPool(
        api, settings, size=pool_size, run="bench", max_creates_per_s=50, max_concurrent_creates=4
    ) as pool:
        while pool.idle < pool_size:
            await asyncio.sleep(0.1)
        stop = time.monotonic() + duration

        async def rollout() -> None:
            nonlocal errors
            while time.monotonic() < stop:
                t = time.perf_counter()
                sb = await pool.acquire()
                waits.append(time.perf_counter() - t)
                try:
                    await sb.exec("true")
                    await asyncio.sleep(hold)
                except Exception:
                    errors += 1
                pool.release(sb)

        await asyncio.gather(*(rollout() for _ in range(workers)))
    return {"acquire_p50_ms": pct(waits, 0.5), "acquire_p99_ms": pct(waits, 0.99), "acquired": len(waits),
            "acquire_errors": errors}  # fmt: skip


async def churn(api: DockerAPI, settings: SandboxSettings, duration: float) -> float:
    async with SandboxPool(
        api, settings, size=8, run="bench", max_creates_per_s=200, max_concurrent_creates=6
    ) as pool:
        while pool.idle < 8:
            await asyncio.sleep(0.1)
        created0, destroyed0, t0 = pool.stats.created, pool.stats.destroyed, time.monotonic()
        stop = t0 + duration

        async def taker() -> None:
            while time.monotonic() < stop:
                pool.release(await pool.acquire())

        await asyncio.gather(*(taker() for _ in range(4)))
        elapsed = time.monotonic() - t0
        return min(pool.stats.created - created0, pool.stats.destroyed - destroyed0) / elapsed


async def under_load(api: DockerAPI, settings: SandboxSettings, n: int, seconds: float) -> dict[str, float]:
    before = mem_available_mb()
    sem = asyncio.Semaphore(6)

    async def make() -> DockerSandbox:
        async with sem:
            return await DockerSandbox.create(api, settings, run="bench")

    boxes = await asyncio.gather(*(make() for _ in range(n)), return_exceptions=True)
    live = [b for b in boxes if isinstance(b, DockerSandbox)]
    create_errors = len(boxes) - len(live)
    await asyncio.sleep(2)
    mem_per = (before - mem_available_mb()) / max(1, len(live))
    log(f"{len(live)} sandboxes live ({create_errors} failed to start), {mem_per:.1f} MB each")
    lat: list[float] = []
    errors = 0

    async def tick(sb: DockerSandbox, offset: float) -> None:
        nonlocal errors
        await asyncio.sleep(offset)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            try:
                r = await sb.exec("true", timeout=10)
                errors += r.exit_code != 0
            except Exception:
                errors += 1
            lat.append(time.perf_counter() - t)
            await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - t)))

    await asyncio.gather(*(tick(sb, i / len(live)) for i, sb in enumerate(live)))
    await asyncio.gather(*(sb.close() for sb in live), return_exceptions=True)
    return {"concurrent": len(live), "load_exec_p50_ms": pct(lat, 0.5), "load_exec_p99_ms": pct(lat, 0.99),
            "load_errors": errors + create_errors, "mem_per_sandbox_mb": round(mem_per, 1)}  # fmt: skip


async def main(a: argparse.Namespace) -> dict[str, float]:
    api = DockerAPI()
    settings = SandboxSettings()
    out: dict[str, float] = {}
    try:
        out |= await exec_latencies(api, settings, a.execs)
        out["exec_speedup"] = round(out["docker_exec_p50_ms"] / out["exec_p50_ms"], 1)
        log(f"exec: {out}")
        out["cold_start_p50_ms"] = await cold_starts(api, settings, 20)
        log(f"cold start p50 {out['cold_start_p50_ms']:.0f} ms")
        out |= await sustained_acquire(
            api, settings, workers=a.workers, hold=a.hold, duration=a.duration, pool_size=a.pool_size
        )
        log(f"sustained acquire: {out['acquire_p99_ms']:.1f} ms p99 over {out['acquired']} acquisitions")
        out["churn_per_s"] = round(await churn(api, settings, a.churn_seconds), 1)
        log(f"churn {out['churn_per_s']}/s")
        out |= await under_load(api, settings, a.concurrent, a.load_seconds)
    finally:
        await api.close()
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--execs", type=int, default=500)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of sustained pool demand")
    ap.add_argument("--workers", type=int, default=4, help="concurrent rollouts in the sustained phase")
    ap.add_argument("--hold", type=float, default=0.5, help="seconds each rollout holds its sandbox")
    ap.add_argument("--pool-size", type=int, default=8)
    ap.add_argument("--churn-seconds", type=float, default=15.0)
    ap.add_argument("--concurrent", type=int, default=200)
    ap.add_argument("--load-seconds", type=float, default=30.0)
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
