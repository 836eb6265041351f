"""Built-in engine decode speed against context length: this tree's engine vs a baseline commit's.

Why: ``bench/engine.py`` decodes after 30-45-token prompts, while a job's prompts carry instructions
and worked examples (the quickstart's are about 370 tokens) and a multi-turn episode's context grows
with every turn. A cost that grows with the context per decode step does not show there.

Each measurement runs ``BatchEngine`` in a fresh process (SmolLM2-135M-Instruct, float32, CPU,
``--threads`` torch threads) from a checkout: this tree, or a ``git worktree`` of
``--baseline-commit``. It admits 16 rows (2 prompts of ``context`` tokens x 8, the way a GRPO step
sends groups), then decodes ``--new-tokens`` tokens for every row (``ignore_eos``, T 0.7) and reports
the mean decode step. Baseline and new alternate, ``--rounds`` times per context, and the medians are
compared. ``--matmul-dtype bfloat16`` runs this tree's engine with its linear layers multiplying in
bfloat16 (``engine.matmul``; the baseline stays float32): with ``--baseline-commit HEAD`` that
compares the two on the same code. Prints one JSON line per context and a last line with every
context's ``ratio`` (baseline decode step / new decode step: above 1 means faster now) and
``prefill_ratio``.

    python bench/engine_context.py --baseline-commit C [--contexts 128,512,2048] [--rounds 3]
                                   [--new-tokens 32] [--threads 1] [--matmul-dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A measurement imports the engine of the checkout under test; before bench/ (its engine.py would
# shadow the engine package).
sys.path.insert(0, os.environ.get("PQRL_BENCH_CHECKOUT", str(ROOT)))

ROWS_PER_PROMPT, PROMPTS = 8, 2


def measure(context: int, new_tokens: int, matmul_dtype: str) -> dict[str, float]:
    """Runs in the checkout under test (its ``engine`` package is first on the path)."""
    import time

    import torch

    from engine.batcher import BatchEngine, Sequence
    from engine.sampling_params import SamplingParams
    from pqrl.model_cache import load_model, load_tokenizer

    model = load_model(dtype=torch.float32)
    if matmul_dtype == "bfloat16":
        from engine.matmul import matmul_in_bfloat16

        matmul_in_bfloat16(model)
    engine = BatchEngine(model, load_tokenizer(), seed=0)
    params = SamplingParams(temperature=0.7, max_new_tokens=new_tokens, ignore_eos=True)

    def one() -> tuple[float, float]:
        # token ids from the middle of the vocabulary: a context of exactly this length
        prompts = [[1000 + (7 * i + p) % 5000 for i in range(context)] for p in range(PROMPTS)]
        rows = [Sequence(rid=f"{p}-{r}", prompt_ids=prompts[p], params=params)
                for p in range(PROMPTS) for r in range(ROWS_PER_PROMPT)]  # fmt: skip
        engine.flush_cache()
        t0 = time.perf_counter()
        engine.step(rows)  # the prefill and the first decode step
        t1 = time.perf_counter()
        steps = 0
        while engine.rows:
            engine.step([])
            steps += 1
        return t1 - t0, (time.perf_counter() - t1) / steps

    one()  # warm-up: allocator, threads
    prefill_s, step_s = one()
    return {"prefill_s": prefill_s, "decode_step_s": step_s}


def _run(root: Path, args: argparse.Namespace, context: int, matmul_dtype: str) -> dict[str, float]:
    env = os.environ | {"PQRL_BENCH_CHECKOUT": str(root), "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, __file__, "--measure", str(context), "--new-tokens", str(args.new_tokens),
           "--threads", str(args.threads), "--matmul-dtype", matmul_dtype]  # fmt: skip
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"measurement in {root} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-commit")
    ap.add_argument("--measure", type=int, help=argparse.SUPPRESS)  # one context, in the checkout under test
    ap.add_argument("--contexts", default="128,512,2048")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--matmul-dtype", choices=("weights", "bfloat16"), default="weights")
    args = ap.parse_args()
    if args.measure is not None:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.measure, args.new_tokens, args.matmul_dtype)))
        return
    if not args.baseline_commit:
        ap.error("--baseline-commit is required")
    from bench.checkout import worktree
    from bench.learning import short_commit

    contexts = [int(c) for c in args.contexts.split(",")]
    ratios, prefill_ratios = {}, {}
    with worktree(args.baseline_commit) as base:
        for context in contexts:
            runs: dict[str, list[dict[str, float]]] = {"baseline": [], "new": []}
            for r in range(args.rounds):  # alternate which goes first
                order = [("baseline", base, "weights"), ("new", ROOT, args.matmul_dtype)]
                for side, root, matmul in order if r % 2 == 0 else order[::-1]:
                    runs[side].append(_run(root, args, context, matmul))
            med = {side: {k: round(statistics.median(x[k] for x in rs), 4) for k in rs[0]}
                   for side, rs in runs.items()}  # fmt: skip
            ratios[context] = round(med["baseline"]["decode_step_s"] / med["new"]["decode_step_s"], 2)
            prefill_ratios[context] = round(med["baseline"]["prefill_s"] / med["new"]["prefill_s"], 2)
            per_round = {s: [x["decode_step_s"] for x in rs] for s, rs in runs.items()}
            print(json.dumps({"context": context, **med, "ratio": ratios[context],
                              "decode_step_s_per_round": per_round}), flush=True)  # fmt: skip
    print(json.dumps({"ratio": ratios, "prefill_ratio": prefill_ratios, "matmul_dtype": args.matmul_dtype,
                      "baseline_commit": args.baseline_commit, "commit": short_commit(ROOT),
                      "rows": PROMPTS * ROWS_PER_PROMPT, "new_tokens": args.new_tokens,
                      "threads": args.threads}))  # fmt: skip


if __name__ == "__main__":
    main()
