"""Env server benchmark: HTTP step overhead, latency under 200 concurrent sessions, saturation,
and the CPU each side spends per step.

Starts a real `pqrl env-server` process on loopback and measures, in the same run:

  step_overhead_p50_ms  p50 of an HTTP step of echo-v1's no-op `echo` tool through HttpEnvClient minus
                        the p50 of the same step through the in-process client
  step_p99_ms           p99 step latency with CONCURRENT live sessions, each stepping once per
                        THINK seconds (an agent waits on its model between tool calls), for SECONDS
  saturated_steps_per_s the same sessions stepping back to back: the server's ceiling here
  errors                failed requests in all phases
  cpu_us_per_step       per phase, [client, server] CPU microseconds per step (a session's create and
                        close included, one per 7 steps): the bench process's own time for
                        HttpEnvClient (sequential), the load process's for the lean client
                        (bench/env_server_load.py, raw keep-alive connections, its own process, so
                        the client is not the bottleneck); the server process's from the kernel

CPU per step is the figure load distorts least; latency and rate follow whatever else runs.
--server-repo DIR runs that checkout's server (DIR/.venv/bin/pqrl, e.g. a worktree at main) instead
of this one's; several, with --rounds, alternate (a baseline and a change in the same run).
Prints one JSON line per server per round. Usage:
python bench/env_server.py [--steps 2000] [--concurrent 200] [--server-repo DIR ...] [--rounds 1]
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
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env_server.client import HttpEnvClient, LocalEnvClient
from env_server.types import ToolCall
from pqrl.redis_server import free_port

HERE = Path(__file__).resolve().parent
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


def load(url: str, token: str, sessions: int, seconds: float, think: float, server: psutil.Process) -> dict:
    """Runs bench/env_server_load.py for ``seconds``: its report plus the server's CPU seconds."""
    cpu0 = sum(server.cpu_times()[:2])
    out = subprocess.run(
        [sys.executable, str(HERE / "env_server_load.py"), url, token, *map(str, (sessions, seconds, think))],
        capture_output=True, text=True, check=True, timeout=seconds + 120,
    )  # fmt: skip
    report = json.loads(out.stdout)
    report["server_cpu_s"] = sum(server.cpu_times()[:2]) - cpu0
    for e in report["errors"]:
        print(f"error: {e}", file=sys.stderr)
    return report


def per_step(cpu_s: float, steps: int) -> float:
    return round(cpu_s / max(steps, 1) * 1e6, 1)


async def one_run(a: argparse.Namespace, repo: Path) -> dict[str, object]:
    port, token = free_port(), "bench-token"
    env = {**os.environ, "PQRL_ENV_TOKEN": token, "PQRL_ENV_MAX_SESSIONS": str(a.concurrent + 8)}
    pqrl = str(repo / ".venv" / "bin" / "pqrl")
    cmd = [pqrl, "env-server", "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(cmd, env=env, cwd=repo)
    proc = psutil.Process(server.pid)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as probe:
            for _ in range(1200):  # a busy machine can take a minute to start it
                try:
                    if (await probe.get(url + "/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"the env server of {repo} did not start")
        local = LocalEnvClient()
        http = HttpEnvClient(url, token=token)
        await sequential_steps(local, 100)  # warm-up
        await sequential_steps(http, 100)
        local_lat = await sequential_steps(local, a.steps)
        client0, server0 = time.process_time(), sum(proc.cpu_times()[:2])
        http_lat = await sequential_steps(http, a.steps)
        seq_cpu = [time.process_time() - client0, sum(proc.cpu_times()[:2]) - server0]
        await http.aclose()
        await local.aclose()
        print(
            f"sequential: local p50 {pct(local_lat, 0.5):.3f} ms, http p50 {pct(http_lat, 0.5):.3f} ms",
            file=sys.stderr,
        )
        paced = load(url, token, a.concurrent, a.seconds, a.think, proc)
        print(f"{a.concurrent} concurrent: {len(paced['lat'])} steps, p50 {pct(paced['lat'], 0.5):.1f} ms",
              file=sys.stderr)  # fmt: skip
        saturated = load(url, token, a.concurrent, a.saturate_seconds, 0.0, proc)
    finally:
        server.terminate()
        server.wait(10)
    cpu = {
        "sequential_httpx": [per_step(c, len(http_lat)) for c in seq_cpu],
        "paced": [per_step(paced[k], len(paced["lat"])) for k in ("cpu_s", "server_cpu_s")],
        "saturated": [per_step(saturated[k], len(saturated["lat"])) for k in ("cpu_s", "server_cpu_s")],
    }
    return {
        "server_repo": str(repo),
        "commit": subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),  # fmt: skip
        "step_overhead_p50_ms": round(pct(http_lat, 0.5) - pct(local_lat, 0.5), 3),
        "http_step_p50_ms": round(pct(http_lat, 0.5), 3),
        "local_step_p50_ms": round(pct(local_lat, 0.5), 3),
        "step_p50_ms": round(pct(paced["lat"], 0.5), 2),
        "step_p99_ms": round(pct(paced["lat"], 0.99), 2),
        "concurrent": a.concurrent,
        "steps_under_load": len(paced["lat"]),
        "saturated_steps_per_s": round(len(saturated["lat"]) / saturated["wall_s"], 1),
        "saturated_p99_ms": round(pct(saturated["lat"], 0.99), 1),
        "errors": paced["n_errors"] + saturated["n_errors"],
        "cpu_us_per_step": cpu,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def main(a: argparse.Namespace) -> None:
    repos = [Path(r).resolve() for r in a.server_repo] or [HERE.parent]
    for round_ in range(a.rounds):
        for repo in repos if round_ % 2 == 0 else repos[::-1]:  # alternate which goes first
            load_before = [round(x, 2) for x in os.getloadavg()]
            result = asyncio.run(one_run(a, repo))
            result["load_before"] = load_before
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--concurrent", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--think", type=float, default=1.0, help="seconds between a session's steps")
    ap.add_argument("--saturate-seconds", type=float, default=10.0)
    ap.add_argument("--server-repo", action="append", default=[], help="a checkout whose server to run")
    ap.add_argument("--rounds", type=int, default=1)
    main(ap.parse_args())
