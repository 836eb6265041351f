"""Checkpoints of a training run: everything needed to continue exactly where it stopped.

A checkpoint directory ``CKPT_DIR/step-000012/`` holds:

- ``model/``: the weights in Hugging Face format (with the tokenizer), loadable by SGLang and the
  built-in engine; a LoRA run's adapter only, in PEFT's format (``trainer.lora``);
- ``trainer_state.pt``: optimizer, learning-rate scheduler and RNG states;
- ``critic.pt``: PPO's value head (``trainer.critic``), when the run has one;
- ``state.json``: step, policy version, task-sampler position, the ids of every group trained so
  far (the model's provenance) and the stream entries of the groups trained since the previous
  checkpoint (acknowledged in Redis only once this checkpoint exists; see ``trainer.loop``);
- ``manifest.json``: what the run was made of (code revision, config, suite and model digests,
  versions, devices), when the job gives one.

A checkpoint is written to a temporary directory and renamed into place, then ``latest`` is
replaced atomically: a process killed at any moment leaves either the old or the new checkpoint
complete, never a half-written one that resume would pick up.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.lora import save_weights

__all__ = ["CheckpointState", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]


@dataclass
class CheckpointState:
    step: int = 0
    policy_version: int = 0
    sampler_position: int | None = None
    trained_groups: list[str] = field(default_factory=list)
    unacked_entries: list[str] = field(default_factory=list)  # acked right after this checkpoint

    @classmethod
    def from_json(cls, text: str) -> CheckpointState:
        return cls(**json.loads(text))


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    ckpt_dir: str | Path,
    state: CheckpointState,
    *,
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    tokenizer: Any = None,
    keep: int = 2,
    optimizer_state: Any = None,
    critic: Any = None,
    manifest: str | Path | None = None,
) -> Path:
    """Writes the checkpoint of ``state.step`` and points ``latest`` at it; returns its path.

    ``optimizer_state``: the state keyed by parameter name, whole tensors (a sharded trainer's
    ``trainer.distributed.full_optimizer_state``); by default ``optimizer.state_dict()``.
    ``manifest``: a file copied in as ``manifest.json`` when it exists (what the run was made of).
    """
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step-{state.step:06d}"
    tmp = ckpt_dir / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    save_weights(model, tmp / "model")  # a LoRA run's: its adapter only
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    torch.save(
        {
            "optimizer": optimizer.state_dict() if optimizer_state is None else optimizer_state,
            "optimizer_keys": "index" if optimizer_state is None else "name",
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": _rng_state(),
        },
        tmp / "trainer_state.pt",
    )
    if critic is not None:
        from trainer.critic import save_critic

        save_critic(critic, tmp)
    if manifest is not None and Path(manifest).is_file():
        shutil.copyfile(manifest, tmp / "manifest.json")
    (tmp / "state.json").write_text(json.dumps(asdict(state)))
    _fsync_tree(tmp)
    if final.exists():  # a step re-done after a resume: the new one replaces it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _write_atomically(ckpt_dir / "latest", final.name)
    for old in sorted(p for p in ckpt_dir.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The checkpoint ``latest`` names, or None when the run has none yet."""
    pointer = Path(ckpt_dir) / "latest"
    if not pointer.is_file():
        return None
    path = Path(ckpt_dir) / pointer.read_text().strip()
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"{pointer} names {path.name}, which is incomplete or missing")
    return path


def load_checkpoint(
    path: str | Path, *, optimizer: torch.optim.Optimizer, scheduler: Any = None, model: Any = None
) -> CheckpointState:
    """Restores optimizer, scheduler and RNG states (the model is loaded from ``path/model``).

    A checkpoint of a sharded trainer keys its optimizer state by parameter name and loads into
    ``model``'s optimizer whether or not it is sharded now (every rank calls this).
    """
    path = Path(path)
    blob = torch.load(path / "trainer_state.pt", weights_only=False)
    if blob.get("optimizer_keys", "index") == "name":
        from trainer.distributed import load_full_optimizer_state

        if model is None:
            raise ValueError(f"{path} keys its optimizer state by parameter name: pass the model")
        load_full_optimizer_state(model, optimizer, blob["optimizer"])
    else:
        optimizer.load_state_dict(blob["optimizer"])
    if scheduler is not None and blob["scheduler"] is not None:
        scheduler.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return CheckpointState.from_json((path / "state.json").read_text())


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
