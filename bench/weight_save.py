"""Publishing weights to disk vs to RAM: the trainer's ``save_pretrained`` of the quickstart model
(SmolLM2-135M, float32, 0.54 GB) into a directory under ``--disk`` and one under ``--ram`` (tmpfs),
alternated ``--rounds`` times in one run, as ``DiskWeightSync`` does every step.

On disk the write goes through the page cache and stalls when the kernel throttles writeback; an
embedded job therefore publishes to /dev/shm when it has room (``launcher/ram_weights.py``).

Prints one JSON line: per place the median and the maximum seconds, every time, and the ratios.
Usage: python bench/weight_save.py [--rounds 6] [--disk /tmp] [--ram /dev/shm]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # before bench/, whose engine.py would shadow the engine package


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--disk", default="/tmp")
    ap.add_argument("--ram", default="/dev/shm")
    args = ap.parse_args()
    import torch

    from pqrl.model_cache import load_model

    torch.set_num_threads(1)
    model = load_model(dtype=torch.float32)
    times: dict[str, list[float]] = {args.disk: [], args.ram: []}
    for _ in range(args.rounds):
        for base, seconds in times.items():
            with tempfile.TemporaryDirectory(dir=base) as d:
                t0 = time.perf_counter()
                model.save_pretrained(d)
                seconds.append(round(time.perf_counter() - t0, 3))
    disk, ram = times[args.disk], times[args.ram]
    out = {
        "disk": {"dir": args.disk, "median_s": statistics.median(disk), "max_s": max(disk), "runs": disk},
        "ram": {"dir": args.ram, "median_s": statistics.median(ram), "max_s": max(ram), "runs": ram},
    }
    out["median_ratio_disk_to_ram"] = round(out["disk"]["median_s"] / out["ram"]["median_s"], 2)
    out["max_ratio_disk_to_ram"] = round(out["disk"]["max_s"] / out["ram"]["max_s"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
