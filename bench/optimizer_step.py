"""The trainer's fixed cost per step on the CPU quickstart's model: clipping the gradient norm and
the fused AdamW step over SmolLM2-135M in float32 on one torch thread (random gradients), the part
of a step that the streaming trainer cannot overlap with waiting for groups (bench/async_vs_sync.py
takes it as OPT_FRAC of a step). The first call also allocates AdamW's states and is reported apart.

    python bench/optimizer_step.py [--repeats 5]

Prints one JSON line: first_s, steady_s (the median of the others), repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(repeats: int) -> dict:
    import torch

    from pqrl.model_cache import load_model
    from trainer.optim import adamw

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = load_model(dtype=torch.float32)
    params = list(model.parameters())
    optimizer = adamw(params, lr=1e-5)
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        times.append(time.perf_counter() - t0)
    return {
        "first_s": round(times[0], 3),
        "steady_s": round(statistics.median(times[1:]), 3),
        "repeats": repeats,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    print(json.dumps(main(ap.parse_args().repeats)))
