"""Retrieval benchmark: a large corpus file indexed once, served by ``pqrl search serve``, queried
over HTTP by concurrent clients as search environments query it.

  1. writes DOCS synthetic documents (a Zipf-distributed vocabulary of invented words with English
     function words mixed in, 40 to 160 words each, a 2-3 word title) as JSONL;
  2. ``pqrl search index``: wall time, peak RSS of the indexing process, index size on disk;
  3. ``pqrl search serve``: time until ``/healthz`` answers (the memory-mapped load), its RSS;
  4. CONCURRENCY clients each sending one-query ``/retrieve`` requests (topk 3) back to back:
     p50/p99 latency and queries per second; then the same with 32 queries per request.

Appends the command, commit, machine and load, and one JSON line to ``--log``.
Usage: nice -n 10 python bench/retrieval.py [--docs 1000000] [--queries 3000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pqrl.redis_server import free_port, stop_process  # noqa: E402

_SYLLABLES = ["ka", "lo", "mi", "ran", "te", "vo", "zel", "qua", "dor", "ith", "bar", "nue", "sa", "fen",
              "gor", "pri", "wy", "tal", "om", "rex", "ul", "che", "va", "mor"]  # fmt: skip
_FUNCTION = ["the", "of", "and", "to", "in", "a", "is", "was", "for", "on", "with", "as", "by", "at", "from",
             "that", "it", "his", "her", "an", "which"]  # fmt: skip


def write_corpus(path: Path, docs: int, seed: int = 0) -> list[str]:
    """``docs`` documents; returns the content vocabulary, most frequent first."""
    rng = random.Random(seed)
    vocab = sorted(
        {"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(120_000)}
    )
    rng.shuffle(vocab)
    weights = 1.0 / (np.arange(len(vocab)) + 2.7) ** 1.07  # Zipf-Mandelbrot, as word counts in text
    gen = np.random.default_rng(seed)
    with path.open("w") as f:
        for start in range(0, docs, 10_000):
            n = min(10_000, docs - start)
            lengths = gen.integers(40, 160, n)
            words = gen.choice(len(vocab), size=int(lengths.sum()), p=weights / weights.sum())
            function = gen.random(len(words)) < 0.35
            fillers = gen.integers(0, len(_FUNCTION), len(words))
            at = 0
            for i, length in enumerate(lengths):
                ws = [
                    _FUNCTION[fillers[j]] if function[j] else vocab[words[j]]
                    for j in range(at, at + int(length))
                ]
                at += int(length)
                title = " ".join(vocab[w].capitalize() for w in words[at - 3 : at - 1])
                row = {"id": str(start + i), "title": title, "text": " ".join(ws).capitalize() + "."}
                f.write(json.dumps(row) + "\n")
    return vocab


def pqrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher.cli", *args]


def index(corpus: Path, env: dict[str, str]) -> dict[str, float]:
    started = time.monotonic()
    proc = psutil.Popen(pqrl("search", "index", "--corpus", str(corpus)), cwd=ROOT, env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    peak = 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, proc.memory_info().rss)
        time.sleep(0.2)
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"pqrl search index failed: {err[-2000:]}")
    size = sum(p.stat().st_size for p in Path(env["PQRL_CACHE"], "corpora").rglob("*") if p.is_file())
    return {"index_s": round(time.monotonic() - started, 1), "index_peak_rss_gib": round(peak / 2**30, 2),
            "index_bytes": size, "corpus_bytes": corpus.stat().st_size, "name": out.strip()}  # fmt: skip


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 2)


async def load(url: str, queries: list[str], concurrency: int, batch: int) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    todo = iter(range(0, len(queries), batch))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        for start in todo:
            body = {"queries": queries[start : start + batch], "topk": 3, "return_scores": True}
            t = time.perf_counter()
            r = await client.post(url + "/retrieve", json=body)
            latencies.append(time.perf_counter() - t)
            if r.status_code != 200 or len(r.json()["result"]) != len(body["queries"]):
                errors += 1

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {"requests": len(latencies), "p50_ms": pct(latencies, 0.5), "p99_ms": pct(latencies, 0.99),
            "queries_per_s": round(len(queries) / wall, 1), "errors": errors}  # fmt: skip


def serve(corpus: Path, env: dict[str, str], queries: list[str], concurrency: int) -> dict[str, object]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(pqrl("search", "serve", "--corpus", str(corpus), "--port", str(port)),
                            cwd=ROOT, env=env)  # fmt: skip
    try:
        started = time.monotonic()
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None:
                raise SystemExit("pqrl search serve exited")
            time.sleep(0.1)
        ready = time.monotonic() - started
        rss_ready = psutil.Process(proc.pid).memory_info().rss
        asyncio.run(load(url, queries[:64], concurrency, 1))  # warm the pages the queries touch
        single = asyncio.run(load(url, queries, concurrency, 1))
        batched = asyncio.run(load(url, queries, concurrency, 32))
        rss = psutil.Process(proc.pid).memory_info().rss
    finally:
        stop_process(proc)
    return {"serve_ready_s": round(ready, 1), "serve_rss_ready_gib": round(rss_ready / 2**30, 2),
            "serve_rss_after_gib": round(rss / 2**30, 2), "single": single, "batch32": batched}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/pqrl-bench-retrieval"))
    ap.add_argument(
        "--log", type=Path, default=None, help="append the result here (e.g. bench/results/retrieval.log)"
    )
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    a.workdir.mkdir(parents=True)
    env = {**os.environ, "PQRL_CACHE": str(a.workdir / "cache")}
    load_before = os.getloadavg()
    # what ran: read now, as the tree may change while it runs
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    t = time.monotonic()
    corpus = a.workdir / "corpus.jsonl"
    vocab = write_corpus(corpus, a.docs)
    result: dict[str, object] = {"docs": a.docs, "generate_s": round(time.monotonic() - t, 1)}
    result |= index(corpus, env)
    rng = random.Random(1)
    common = vocab[: len(vocab) // 10]  # queries name words that occur, some rare, some common
    queries = [" ".join(rng.choice(common if rng.random() < 0.5 else vocab) for _ in range(rng.randint(2, 5)))
               for _ in range(a.queries)]  # fmt: skip
    result |= serve(corpus, env, queries, a.concurrency)
    result["concurrency"] = a.concurrency
    loads = ", ".join(f"{x:.2f}" for x in load_before), ", ".join(f"{x:.2f}" for x in os.getloadavg())
    head = (
        f"# {' '.join(sys.argv)}   ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit "
        f"{commit.stdout.strip()}{' + working tree' if dirty.strip() else ''}, {os.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM; load before {loads[0]}, after {loads[1]})"
    )
    line = json.dumps(result)
    print(head, line, sep="\n")
    if a.log:
        with a.log.open("a") as f:
            f.write(f"{head}\n{line}\n")
    shutil.rmtree(a.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
