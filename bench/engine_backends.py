"""The built-in engine, vLLM and plain ``transformers`` ``generate`` on identical requests, in one run.

Requests: 2 chat prompts x 8 samples x 48 new tokens (temperature 1, ``ignore_eos``, a seed per
sample), all 16 sent at once (``generate``: one left-padded batch of 16); SmolLM2-135M-Instruct on
the CPU. Per backend: tokens/s over the 16 (wall clock from the first send to the last answer),
time to first token (a 1-token request per prompt, each prompt's first request after a warm-up on
another prompt, so no prefix-cache hit; their mean), weight-sync seconds
(``update_weights_from_disk`` of a saved checkpoint, which ``generate`` has no counterpart of),
start seconds (process start to healthy), and a mismatch KL in the job's form
(``offpolicy/mismatch_kl``: the mean over generated tokens of the engine's logprob minus the
scorer's, a k1 estimate of KL(engine || scorer), with its standard error, and the k3 estimate,
which is never negative), here against a float32 transformers forward. The load before each phase
and whether the tree differs from the commit are recorded; the speed ratios are left out when any
phase started on a machine busier than its cores. Each engine runs as a job starts it: the
built-in one multiplies in bfloat16 on CPUs with AVX512-BF16 or AMX (``--matmul-dtype bfloat16``,
as the trainer's autocast), vLLM in bfloat16.

Usage: python bench/engine_backends.py [--out bench/results/engine_backends_cpu.json]
Needs the vLLM venv (PQRL_SETUP_ENGINES=vllm bash scripts/setup.sh); without it vLLM is left out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning import short_commit, tree_differs  # noqa: E402
from engine.backends import engine_client  # noqa: E402
from engine.client import SamplingParams  # noqa: E402
from engine.vllm import vllm_python  # noqa: E402
from launcher.services import engine_process  # noqa: E402
from pqrl.model_cache import DEFAULT_MODEL, load_tokenizer, prepare_model  # noqa: E402
from pqrl.redis_server import free_port  # noqa: E402

PROMPTS = ["What is 17 + 25? Answer with the number.", "Tell me a short story about a dragon."]
WARM_UP = "Say hello."  # not one of PROMPTS: their first-token times are no prefix-cache hit
SAMPLES, NEW_TOKENS = 8, 48


def prompt_ids(texts: list[str] = PROMPTS) -> list[list[int]]:
    tok = load_tokenizer()
    return [
        list(
            tok.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )  # fmt: skip
        for p in texts
    ]


def trainer_logprobs(model: Any, prompt: list[int], out: list[int]) -> list[float]:
    import torch

    ids = torch.tensor([prompt + out])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(out)[:, None])[:, 0].tolist()


async def engine_run(backend: str, prompts: list[list[int]], ckpt: Path, log: Path) -> dict[str, Any]:
    port = free_port()
    t0 = time.monotonic()
    with engine_process(DEFAULT_MODEL, port, log, threads=os.cpu_count() or 1, backend=backend):
        async with engine_client(f"http://127.0.0.1:{port}", backend, timeout_s=1800) as client:
            await client.wait_until_healthy(timeout_s=1200)
            start_s = time.monotonic() - t0
            one = SamplingParams(max_new_tokens=1, ignore_eos=True, sampling_seed=0)
            await client.generate(prompt_ids([WARM_UP])[0], one)
            ttft = []
            for p in prompts:
                t = time.monotonic()
                await client.generate(p, one)
                ttft.append(time.monotonic() - t)
            reqs = [(p, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, sampling_seed=100 * i + j))
                    for i, p in enumerate(prompts) for j in range(SAMPLES)]  # fmt: skip
            t = time.monotonic()
            gens = await asyncio.gather(*(client.generate(p, sp) for p, sp in reqs))
            wall = time.monotonic() - t
            t = time.monotonic()
            await client.update_weights_from_disk(str(ckpt), 1)
            sync_s = time.monotonic() - t
    tokens = sum(len(g.output_ids) for g in gens)
    return {"start_s": round(start_s, 1), "tokens": tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 1), "ttft_s": round(statistics.fmean(ttft), 3),
            "ttft_each_s": [round(x, 3) for x in ttft],
            "weight_sync_s": round(sync_s, 2),
            "samples": [(p, g.output_ids, g.logprobs) for (p, _), g in zip(reqs, gens, strict=True)],
            }  # fmt: skip


def transformers_run(model: Any, prompts: list[list[int]]) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    model.generate(torch.tensor(prompt_ids([WARM_UP])), max_new_tokens=1, do_sample=True)
    ttft = []
    for p in prompts:
        t = time.monotonic()
        model.generate(torch.tensor([p]), max_new_tokens=1, do_sample=True)
        ttft.append(time.monotonic() - t)
    # all 16 in one batch, as the engines get them at once: the shorter prompt padded on the left
    width = max(len(p) for p in prompts)
    rows = [p for p in prompts for _ in range(SAMPLES)]
    pad = load_tokenizer().pad_token_id or 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    t = time.monotonic()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                         do_sample=True, top_k=0, top_p=1.0, pad_token_id=pad)  # fmt: skip
    wall = time.monotonic() - t
    tokens = (out.shape[1] - width) * len(rows)
    return {"tokens": tokens, "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1),
            "ttft_s": round(statistics.fmean(ttft), 3), "ttft_each_s": [round(x, 3) for x in ttft],
            "weight_sync_s": None}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/engine_backends_cpu.json"))
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    header = {"command": " ".join(["python", *sys.argv]), "commit": short_commit(ROOT),
              "tree_differs_from_commit": tree_differs(ROOT), "load_at_start": os.getloadavg(),
              "cpus": os.cpu_count()}  # fmt: skip
    print(json.dumps(header), file=sys.stderr)
    prompts = prompt_ids()
    model = AutoModelForCausalLM.from_pretrained(prepare_model(), dtype=torch.float32).eval()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "v1"
        model.save_pretrained(ckpt)  # the same weights: what is timed is the load, not what changes
        backends = ["builtin", "vllm"] if vllm_python() is not None else ["builtin"]
        for backend in backends:
            load = os.getloadavg()[0]
            r = asyncio.run(engine_run(backend, prompts, ckpt, Path(tmp) / f"{backend}.log"))
            diffs = [e - t for p, out, lps in r.pop("samples")
                     for e, t in zip(lps, trainer_logprobs(model, p, out), strict=True)]  # fmt: skip
            # k1 (the job's offpolicy/mismatch_kl) with its standard error, and k3 (never negative)
            r["mismatch_kl"] = statistics.fmean(diffs)
            r["mismatch_kl_se"] = statistics.stdev(diffs) / len(diffs) ** 0.5
            r["mismatch_k3"] = statistics.fmean(math.exp(-d) - 1 + d for d in diffs)
            r["mismatch_abs_max"] = max(abs(d) for d in diffs)
            r["load_before"] = load
            results[backend] = r
            print(backend, json.dumps(r), file=sys.stderr)
    load = os.getloadavg()[0]
    results["transformers"] = transformers_run(model, prompts) | {"load_before": load}
    base = results["builtin"]["tokens_per_s"]
    busy = any(r["load_before"] > (os.cpu_count() or 1) for r in results.values())
    for r in results.values():  # speed ratios only when no phase ran on a busy machine
        r["tokens_per_s_vs_builtin"] = None if busy else round(r["tokens_per_s"] / base, 2)
    out = {"header": header | {"load_at_end": os.getloadavg()}, "results": results}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
