"""Built-in engine throughput: generated tokens/s at concurrency 1 and 16, in one run.

Starts the built-in engine server (SmolLM2-135M-Instruct, CPU unless --device says otherwise) in a
subprocess on a free loopback port and drives it over HTTP with ``engine.client``:

  c1:  one request at a time, ``--requests-c1`` requests back to back;
  c16: 16 requests at once (continuous batching shares every decode step among them).

Every request samples (temperature 1, its own seed) exactly ``--max-new-tokens`` tokens
(``ignore_eos``) after a chat prompt of 30-45 tokens, so both settings generate the same work per
request. After a warm-up, c1 and c16 are measured ``--rounds`` times interleaved and the medians taken
(the machine is shared and noisy). Prints one JSON line: tok_s_c1, tok_s_c16, ratio. Target ratio >= 3.
Usage: python bench/engine.py [--max-new-tokens N] [--rounds R] [--requests-c1 K] [--device D]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.client import EngineClient, SamplingParams  # noqa: E402
from pqrl.model_cache import load_tokenizer  # noqa: E402

QUESTIONS = [
    "Tell me a story about a dragon.",
    "Explain how rain forms.",
    "What is the capital of France and why is it famous?",
    "Write a poem about the sea.",
    "How do computers add numbers?",
    "Describe a sunny day at the beach.",
    "Why is the sky blue?",
    "List some uses of copper.",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(port: int, device: str) -> subprocess.Popen:
    code = (
        "import argparse, sys\n"
        "from engine.config import add_serve_arguments\n"
        "from engine.serve_command import serve\n"
        "p = argparse.ArgumentParser(); add_serve_arguments(p)\n"
        "sys.exit(serve(p.parse_args(sys.argv[1:])))\n"
    )
    args = ["--port", str(port), "--device", device, "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env)


async def _run(client: EngineClient, prompts: list[list[int]], concurrency: int, n: int, seed: int) -> float:
    """Generated tokens per second for ``len(prompts)`` requests, ``concurrency`` at a time."""
    queue = list(enumerate(prompts))
    generated = 0

    async def worker() -> None:
        nonlocal generated
        while queue:
            i, prompt = queue.pop()
            params = SamplingParams(
                temperature=1.0, max_new_tokens=n, ignore_eos=True, sampling_seed=seed + i
            )
            g = await client.generate(prompt, params)
            generated += len(g.output_ids)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return generated / (time.perf_counter() - start)


async def bench(url: str, args: argparse.Namespace) -> dict[str, float]:
    tok = load_tokenizer()
    prompts = [
        list(
            tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)["input_ids"]
        )
        for q in QUESTIONS
    ]
    c16_prompts = [prompts[i % len(prompts)] for i in range(16)]
    async with EngineClient(url) as client:
        await client.wait_until_healthy(timeout_s=300)
        await _run(client, c16_prompts[:4], 4, 8, seed=0)  # warm-up: kernels, allocator, threads
        c1, c16 = [], []
        for r in range(args.rounds):
            c1.append(await _run(client, prompts[: args.requests_c1], 1, args.max_new_tokens, seed=100 * r))
            c16.append(await _run(client, c16_prompts, 16, args.max_new_tokens, seed=100 * r + 50))
    tok_s_c1, tok_s_c16 = statistics.median(c1), statistics.median(c16)
    return {
        "tok_s_c1": round(tok_s_c1, 2),
        "tok_s_c16": round(tok_s_c16, 2),
        "ratio": round(tok_s_c16 / tok_s_c1, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests-c1", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    port = _free_port()
    server = _start_server(port, args.device)
    try:
        result = asyncio.run(bench(f"http://127.0.0.1:{port}", args))
    finally:
        server.terminate()
        server.wait(30)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
