"""Multi-process training through torch FSDP2, launched by ``torchrun``.

Every function is a pass-through in a world of one, so the single-process trainer calls them
unconditionally. The pieces, in the order a step uses them:

- ``init_from_env``: join the process group torchrun describes (gloo on CPU, nccl on CUDA).
- ``shard``: FSDP2 per decoder layer, then the root; gradients reduced by SUM (see below).
- ``broadcast_groups``: rank 0 reads groups from Redis and sends them to every rank as codec bytes.
- ``shard_of`` / ``equalize_passes``: which trajectories a rank trains on, and enough empty
  micro-batches that every rank runs the same number of forward/backward passes (each FSDP pass
  is a collective: a rank that stops early deadlocks the others).
- ``all_reduce_scalar`` + ``rank_normalizer``: the step's token-mean across ranks;
  ``all_reduce_sums``: the step's metric sums.
- ``full_model_state`` / ``full_optimizer_state`` / ``load_full_optimizer_state``: whole tensors
  on rank 0 for Hugging Face checkpoints and weight publication, and back into shards on resume.

``trainer.ranks`` runs these in lock step: rank 0 announces each collective operation, the other
ranks follow.

Why SUM, not FSDP's default average: the loss is a token-mean over the whole step, so each rank
divides its summed token loss by the global token count and the step gradient is the plain sum of
the ranks' gradients. FSDP2 averages by default, with ``ReduceOp.AVG`` for fp32/bf16 reductions,
and some torch releases' gloo reduce-scatter silently ran AVG as SUM, so the same code gave
gradients ``world_size`` times apart on CPU and GPU. On torch 2.13 AVG is a true
average (tests/trainer/test_distributed.py measures both), but a SUM reduction needs no divide
factor at all and every backend implements it, so ``shard`` forces it.

Deliberately left out: tensor/sequence/pipeline parallelism, HSDP meshes, CPU offload, sharded
checkpoints (each checkpoint holds whole tensors gathered on rank 0, which bounds the model size by
rank 0's CPU memory) and sharding the reference model of the KL term (each rank holds a copy).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, NoReturn, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from pqrl.trajectory import Trajectory
from trainer.layers import decoder_layers

__all__ = [
    "DistContext",
    "Reduction",
    "all_reduce_scalar",
    "all_reduce_sums",
    "barrier",
    "broadcast_groups",
    "broadcast_int",
    "equalize_passes",
    "full_model_state",
    "full_optimizer_state",
    "init_from_env",
    "load_full_optimizer_state",
    "rank_normalizer",
    "shard",
    "shard_of",
    "exit_rank",
    "shutdown",
]

T = TypeVar("T")
Reduction = Literal["sum", "avg"]


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the training job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0 reads from Redis, logs metrics and writes checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_from_env(
    env: Mapping[str, str] | None = None, *, backend: str | None = None, timeout_s: float = 6 * 3600
) -> DistContext:
    """Joins the process group described by torchrun's variables, or returns a world of one.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (and, through ``env://``, ``MASTER_ADDR`` /
    ``MASTER_PORT``). Without them, or with ``WORLD_SIZE=1``, nothing is initialised.

    Args:
        env: the environment to read; ``os.environ`` by default.
        backend: overrides the choice of ``nccl`` when CUDA is available, ``gloo`` otherwise.
        timeout_s: how long a collective may wait. The other ranks wait in a broadcast while rank
            0 waits for rollouts or evaluates, so the default is hours, not torch's 10 minutes.

    Returns:
        The ``DistContext``; its device is ``cuda:LOCAL_RANK`` (made current) or the CPU.
    """
    env = os.environ if env is None else env
    world_size = int(env.get("WORLD_SIZE", "1"))
    rank, local_rank = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and backend != "gloo"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in env:
                raise RuntimeError(f"WORLD_SIZE={world_size} but {key} is unset: launch with torchrun")
        dist.init_process_group(
            backend or ("nccl" if cuda else "gloo"),
            init_method=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
            rank=rank,
            world_size=world_size,
            device_id=device if cuda else None,  # binds NCCL to this GPU up front
            timeout=timedelta(seconds=timeout_s),
        )
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def barrier(ctx: DistContext) -> None:
    """Waits until every rank gets here (no-op in a world of one)."""
    if ctx.distributed:
        dist.barrier()


def shutdown(ctx: DistContext) -> None:
    """Leaves the process group (no-op in a world of one)."""
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


def exit_rank(code: int) -> NoReturn:
    """Ends a rank's process after ``shutdown`` without running C++ static destructors: gloo can
    leave a joinable thread in one whose destructor calls std::terminate at interpreter exit, a
    SIGABRT after all the work is done (seen on a loaded machine) that torchrun reports as the
    rank failing."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def shard(model: nn.Module, ctx: DistContext, *, mixed_precision: bool | None = None) -> nn.Module:
    """Applies FSDP2 to each decoder layer, then to the root, with SUM gradient reduction.

    Decoder layers are the modules named by the model's ``_no_split_modules`` (transformers sets
    it, e.g. ``LlamaDecoderLayer``); the root unit holds the rest (embeddings, tied head, norm).
    Parameters become ``DTensor`` shards; after backward each rank holds its shard of the
    *summed* gradient, so rank losses must use ``rank_normalizer(..., "sum")``.

    Args:
        model: the model, built identically (same seed or checkpoint) on every rank.
        ctx: from ``init_from_env``; a world of one returns ``model`` unchanged.
        mixed_precision: bf16 parameters with fp32 gradient reduction; default on for CUDA.

    Returns:
        The same module object, now an ``FSDPModule``.
    """
    if not ctx.distributed:
        return model
    # Imported here: FSDP pulls in DTensor and sympy, about 45 MiB and 0.5 s that a
    # single-process trainer never uses.
    try:  # torch >= 2.6
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch 2.4 / 2.5
        from torch.distributed._composable.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    if mixed_precision is None:
        mixed_precision = ctx.device.type == "cuda"
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else MixedPrecisionPolicy()
    )
    for module in decoder_layers(model):
        fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            _sum_gradients(module)
    return model


def _sum_gradients(module: Any) -> None:
    """Makes ``module`` reduce gradients by a plain SUM (divide factor 1, no AVG/PREMUL_SUM op)."""
    if hasattr(module, "set_force_sum_reduction_for_comms"):  # torch >= 2.9
        module.set_force_sum_reduction_for_comms(True)
        module.set_gradient_divide_factor(1.0)
    else:
        # NOTE: older torch turns a factor into pre/post division around SUM on gloo, PREMUL_SUM
        # on nccl; not exercised by the tests here (they run torch 2.13).
        module.set_reduce_scatter_divide_factor(1.0)


def broadcast_groups(
    groups: Sequence[Sequence[Trajectory]] | None, ctx: DistContext
) -> list[list[Trajectory]]:
    """Sends rank 0's groups to every rank, one codec blob per group (no pickle on the wire).

    Three broadcasts: the group count, each blob's length, the concatenated blobs as one byte
    tensor on ``ctx.device`` (nccl moves device tensors only).

    Args:
        groups: the groups rank 0 read from Redis; ignored on the other ranks (pass None).
        ctx: from ``init_from_env``.

    Returns:
        The groups, on every rank; decoded records view one shared buffer.
    """
    if not ctx.distributed:
        return [list(g) for g in groups or ()]
    from pqrl.codec import decode_many, encode_many  # msgpack: not needed by the compute path

    if ctx.is_main:
        if groups is None:
            raise ValueError("rank 0 must pass the groups it read")
        blobs = [encode_many(g) for g in groups]
        count = torch.tensor([len(blobs)], dtype=torch.int64, device=ctx.device)
    else:
        count = torch.zeros(1, dtype=torch.int64, device=ctx.device)
    dist.broadcast(count, src=0)
    if ctx.is_main:
        lens = torch.tensor([len(b) for b in blobs], dtype=torch.int64, device=ctx.device)
    else:
        lens = torch.zeros(int(count), dtype=torch.int64, device=ctx.device)
    if int(count) == 0:
        return []
    dist.broadcast(lens, src=0)
    if ctx.is_main:
        payload = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8).to(ctx.device)
    else:
        payload = torch.empty(int(lens.sum()), dtype=torch.uint8, device=ctx.device)
    dist.broadcast(payload, src=0)
    if ctx.is_main:
        return [list(g) for g in groups]
    buf = memoryview(payload.cpu().numpy().tobytes())
    ends = np.cumsum(lens.cpu().numpy())
    return [decode_many(buf[end - n : end]) for n, end in zip(lens.tolist(), ends.tolist(), strict=True)]


def shard_of(items: Sequence[T], ctx: DistContext, *, cost: Callable[[T], float] | None = None) -> list[T]:
    """This rank's share of ``items``; every rank must pass the same items in the same order.

    Without ``cost``, rank ``r`` takes items ``r, r + W, r + 2W, ...``. With ``cost`` (e.g. token
    count: agentic trajectories vary tenfold in length) items go greedily, longest first, to the
    rank with the least cost so far (LPT scheduling), ties to the lower index, so the slowest rank
    carries at most 4/3 of the optimum. Either way the shares partition ``items`` and keep their
    order; a rank may get none (it still runs ``equalize_passes``' empty passes).
    """
    if not ctx.distributed:
        return list(items)
    if cost is None:
        return list(items[ctx.rank :: ctx.world_size])
    load = [0.0] * ctx.world_size
    owner = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-cost(items[i]), i)):
        r = min(range(ctx.world_size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += cost(items[i])
    return [x for x, r in zip(items, owner, strict=True) if r == ctx.rank]


def all_reduce_scalar(x: float, ctx: DistContext, op: Literal["sum", "max"] = "sum") -> float:
    """``x`` summed (or maxed) over ranks, in float64 so token counts stay exact."""
    if not ctx.distributed:
        return float(x)
    t = torch.tensor([x], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return float(t)


def all_reduce_sums(sums: Mapping[str, float], keys: Sequence[str], ctx: DistContext) -> dict[str, float]:
    """``sums[k]`` added over ranks for every ``k`` in ``keys`` (a missing one counts 0); keys
    ending in ``_max`` take the maximum instead. Every rank must pass the same ``keys``."""
    if not ctx.distributed:
        return {k: float(sums.get(k, 0.0)) for k in keys}
    added = [k for k in keys if not k.endswith("_max")]
    maxed = [k for k in keys if k.endswith("_max")]
    out: dict[str, float] = {}
    for names, op, missing in ((added, dist.ReduceOp.SUM, 0.0), (maxed, dist.ReduceOp.MAX, -np.inf)):
        if not names:
            continue
        t = torch.tensor([float(sums.get(k, missing)) for k in names], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(t, op=op)
        out |= {k: (float(v) if v != -np.inf else 0.0) for k, v in zip(names, t.tolist(), strict=True)}
    return {k: out[k] for k in keys}


def broadcast_int(x: int | None, ctx: DistContext) -> int:
    """Rank 0's ``x`` on every rank (the others pass None)."""
    if not ctx.distributed:
        return int(x or 0)
    t = torch.tensor([int(x) if ctx.is_main and x is not None else 0], dtype=torch.int64, device=ctx.device)
    dist.broadcast(t, src=0)
    return int(t)


def _state_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module, ctx: DistContext) -> dict[str, torch.Tensor] | None:
    """The whole state dict on rank 0's CPU (a collective: every rank calls it); None on the other
    ranks, and in a world of one (where ``model.state_dict()`` is already whole)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if not ctx.distributed:
        return None
    state = get_model_state_dict(model, options=_state_options())
    return state if ctx.is_main else None


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext) -> Any:
    """The optimizer state keyed by parameter name, whole tensors on rank 0's CPU (a collective)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer, options=_state_options())
    return state if ctx.is_main else None


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: Any) -> None:
    """Loads ``full_optimizer_state``'s output into a (sharded or plain) optimizer; every rank
    passes the whole state (a collective when sharded)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def equalize_passes(batches: list[list[T]], ctx: DistContext) -> list[list[T]]:
    """Appends empty micro-batches so every rank runs as many forward/backward passes as the busiest.

    Every FSDP forward all-gathers and every backward reduce-scatters, so the ranks must run the
    same sequence of forwards and backwards. The caller runs an empty micro-batch through exactly
    the code of a real one (the proximal no-grad forward included) on a dummy row under loss mask
    0: the loss adds zero, the collectives pair up.
    """
    most = int(all_reduce_scalar(len(batches), ctx, "max"))
    return batches + [[] for _ in range(most - len(batches))]


def rank_normalizer(global_tokens: float, world_size: int, reduction: Reduction = "sum") -> float:
    """The denominator a rank divides its summed token loss by, so the reduced gradient is the
    single-process gradient of the step's token-mean loss.

    One process: ``L = (1/N) sum_r S_r``, gradient ``(1/N) sum_r grad S_r`` (``S_r``: rank r's
    summed token loss, ``N``: the step's mask-1 tokens over all ranks). A rank computing
    ``S_r / D`` contributes ``grad S_r / D``; SUM reduction gives the single-process gradient iff
    ``D = N``, AVG reduction (which divides by ``W`` again) iff ``D = N / W``. ``shard`` reduces by
    SUM, so pass ``global_tokens = all_reduce_scalar(local_tokens, ctx)`` and keep the default.
    (a token mean clamps its token count at 1, as ``trainer.losses.sequence_weights`` does, so
    ``N / W < 1`` would be wrong: another reason for SUM.)
    """
    if reduction == "sum":
        return float(global_tokens)
    if reduction == "avg":
        return float(global_tokens) / world_size
    raise ValueError(f"unknown reduction {reduction!r}")
