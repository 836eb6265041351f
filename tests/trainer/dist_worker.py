"""One FSDP2 GRPO step on a tiny Llama, run by ``torchrun`` from test_distributed.py.

Usage: ``torchrun --standalone --nproc-per-node 2 tests/trainer/dist_worker.py OUT.pt``. Rank 0
writes the full gradients, gradient norm and updated parameters to ``OUT.pt``, plus what each
rank received and what a raw (unconfigured) FSDP2 module reduces on this backend. The helpers
above ``main`` are shared with the single-process reference in the test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

if __name__ == "__main__":  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pqrl.trajectory import Trajectory, Turn
from trainer.advantages import grpo_advantages
from trainer.config import AlgorithmConfig
from trainer.distributed import (
    DistContext,
    all_reduce_scalar,
    broadcast_groups,
    equalize_passes,
    exit_rank,
    init_from_env,
    rank_normalizer,
    shard,
    shard_of,
    shutdown,
)
from trainer.logprobs import token_logprobs
from trainer.objective import micro_batch_loss

VOCAB = 1000
LR = 1e-2
# Above most |g| after clipping, so AdamW's first step is ~ lr * g / eps (proportional to the
# gradient, not its sign): a wrong gradient scale shows in the parameters, and float noise in
# near-zero gradients is not blown up to a whole +-lr step.
ADAM_EPS = 1e-4
MAX_GRAD_NORM = 0.01  # below the measured norm (0.03), so clipping is active and checked too
MICRO_BATCH = 3  # rank 0 gets 4 trajectories (2 passes), rank 1 gets 3 (1 pass + 1 empty)


def tiny_model() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,  # as SmolLM2
    )  # fmt: skip
    return LlamaForCausalLM(cfg).float().eval()  # eval: no dropout, prox and trained logp agree


def make_groups(sizes: tuple[int, ...] = (4, 3)) -> list[list[Trajectory]]:
    """Groups of single-turn records of different lengths, rewards with signal in every group."""
    rng = np.random.default_rng(7)
    groups = []
    for g, size in enumerate(sizes):
        group = []
        for i in range(size):
            prompt, gen = int(rng.integers(3, 8)), int(rng.integers(4, 14))
            T = prompt + gen
            generated = np.r_[np.zeros(prompt), np.ones(gen)].astype(np.uint8)
            group.append(
                Trajectory(
                    id=f"g{g}-{i}", run_id="r", task_id=f"t{g}", group_id=f"g{g}", env="calc-v1",
                    tokens=rng.integers(0, VOCAB, T), generated=generated, loss_mask=generated,
                    behavior_logprobs=np.where(generated == 1, -rng.random(T) * 4, 0.0),
                    versions=np.where(generated == 1, 0, -1), prompt_len=prompt,
                    turns=(Turn(prompt, T),), reward=float(i % 2),
                )
            )  # fmt: skip
        groups.append(group)
    return groups


def flatten_with_advantages(groups: list[list[Trajectory]]) -> tuple[list[Trajectory], list[float]]:
    trajs, advs = [], []
    for group in groups:
        trajs += group
        advs += grpo_advantages(torch.tensor([[t.reward for t in group]]))[0].tolist()
    return trajs, advs


def collate(trajs: list[Trajectory], advs: list[float]) -> dict[str, Tensor]:
    T = max(t.num_tokens for t in trajs)

    def pad(rows: list[np.ndarray], dtype: torch.dtype) -> Tensor:
        return torch.stack(
            [torch.nn.functional.pad(torch.as_tensor(np.array(r)), (0, T - len(r))) for r in rows]
        ).to(dtype)

    mask = pad([t.loss_mask for t in trajs], torch.float32)
    return {
        "tokens": pad([t.tokens for t in trajs], torch.long),
        "attention_mask": pad([np.ones(t.num_tokens) for t in trajs], torch.long),
        "mask": mask,
        "behavior": pad([t.behavior_logprobs for t in trajs], torch.float32),
        "adv": torch.tensor(advs)[:, None].expand_as(mask),
    }


def summed_token_loss(model: nn.Module, mb: dict[str, Tensor], normalizer: float | None) -> Tensor:
    """The step's loss (``trainer.objective``) of one micro-batch, token mean over ``normalizer``
    tokens (its own count if None)."""
    with torch.no_grad():
        logp_prox = token_logprobs(model, mb["tokens"], mb["attention_mask"], 1.0)
    logp = token_logprobs(model, mb["tokens"], mb["attention_mask"], 1.0)
    m = mb["mask"].bool()
    count = float(m.sum()) if normalizer is None else normalizer
    weights = torch.full((int(m.sum()),), 1.0 / max(count, 1.0))
    lengths = m.sum(-1).tolist()
    return micro_batch_loss(
        logp[m], logp_prox[m], mb["behavior"][m], mb["adv"][m], weights, lengths, AlgorithmConfig()
    ).loss


def empty_batch() -> dict[str, Tensor]:
    """Two tokens under loss mask 0: run through the same code as a real micro-batch (same number
    of forwards, so FSDP's all-gathers and reduce-scatters pair up across ranks), adding zero."""
    zeros = torch.zeros(1, 2)
    return {"tokens": zeros.long(), "attention_mask": torch.ones(1, 2, dtype=torch.long), "mask": zeros,
            "behavior": zeros, "adv": zeros}  # fmt: skip


def full(t: Tensor) -> Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def raw_fsdp_reduction(ctx: DistContext) -> float:
    """What an unconfigured FSDP2 module gives for rank gradients 1, 2, ...: their mean or sum."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    lin = fully_shard(nn.Linear(4, 4, bias=False), mesh=init_device_mesh("cpu", (ctx.world_size,)))
    (lin(torch.eye(4)).sum() * (ctx.rank + 1)).backward()  # d/dW = rank + 1 everywhere
    return float(full(lin.weight.grad).mean())


def main(out: str) -> None:
    ctx = init_from_env(backend="gloo")  # CPU processes even where CUDA is present
    torch.set_num_threads(1)
    sent = make_groups() if ctx.is_main else None
    groups = broadcast_groups(sent, ctx)
    received_ok = all(
        a == b for ga, gb in zip(groups, make_groups(), strict=True) for a, b in zip(ga, gb, strict=True)
    )
    model = shard(tiny_model(), ctx)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, eps=ADAM_EPS)
    trajs, advs = flatten_with_advantages(groups)  # advantages need whole groups: before sharding
    mine = shard_of(list(range(len(trajs))), ctx, cost=lambda i: trajs[i].num_tokens)
    global_tokens = all_reduce_scalar(sum(float(trajs[i].loss_mask.sum()) for i in mine), ctx)
    normalizer = rank_normalizer(global_tokens, ctx.world_size)
    batches = equalize_passes([mine[k : k + MICRO_BATCH] for k in range(0, len(mine), MICRO_BATCH)], ctx)
    for b in batches:
        mb = collate([trajs[i] for i in b], [advs[i] for i in b]) if b else empty_batch()
        summed_token_loss(model, mb, normalizer).backward()
    grads = {n: full(p.grad) for n, p in model.named_parameters()}
    grad_norm = full(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM))
    optimizer.step()
    params = {n: full(p.detach()) for n, p in model.named_parameters()}
    checks = torch.tensor([float(received_ok), float(len(batches)), float(len(mine))])
    all_checks = [torch.zeros_like(checks) for _ in range(ctx.world_size)]
    torch.distributed.all_gather(all_checks, checks)
    raw = raw_fsdp_reduction(ctx)
    if ctx.is_main:
        torch.save(
            {"grads": grads, "grad_norm": grad_norm, "params": params, "checks": torch.stack(all_checks),
             "raw_reduction": raw, "world_size": ctx.world_size},
            out,
        )  # fmt: skip
    shutdown(ctx)
    exit_rank(0)  # as pqrl train's ranks do: no C++ static destructors (gloo can abort in one)


if __name__ == "__main__":
    main(sys.argv[1])
