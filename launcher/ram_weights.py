"""Where an embedded job publishes its weights for the engine: in RAM (tmpfs) when there is room.

Every step the trainer saves the whole model and the engine loads it. On disk that write goes
through the page cache and stalls whenever the kernel throttles writeback: saving the 0.54 GB
quickstart model took 0.17 to 2.8 s here, where /dev/shm took 0.32 to 0.34 s
(bench/weight_save.py). An embedded job's engine runs on this machine, so it can read from there.
Published weights serve only the engines (checkpoints stay in the run directory), so the job
removes them when it ends.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

__all__ = ["model_bytes", "ram_weights_dir"]


def model_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def ram_weights_dir(run_dir: Path, size: int, keep: int, shm: Path = Path("/dev/shm")) -> Path | None:
    """A directory under ``shm`` for the run's published weights, or None when ``shm`` is missing,
    read-only or too small for ``keep`` versions of ``size`` bytes plus the one being written
    (containers often give /dev/shm 64 MB). The name follows the run directory, so a run restarted
    after a crash finds, and clears, what its previous process left."""
    if not shm.is_dir() or not os.access(shm, os.W_OK) or shutil.disk_usage(shm).free < (keep + 1) * size:
        return None
    key = hashlib.blake2b(str(run_dir.resolve()).encode(), digest_size=8).hexdigest()
    return shm / f"pqrl-weights-{key}"
