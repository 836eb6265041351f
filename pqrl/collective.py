"""The weights process group shared by a trainer (rank 0) and its engines: SGLang's NCCL weight path.

``init_weights_group`` builds the group as SGLang's ``init_custom_process_group`` does (a TCPStore
rendezvous, keys prefixed with the group's name), so either side interoperates with SGLang's;
``broadcast_from_rank0`` sends (rank 0) or receives (every other rank) one broadcast per tensor;
``destroy_group`` leaves it. ``in_daemon_thread`` runs any of these blocking calls off the event loop.

The trainer (``trainer.weight_sync``) and the built-in engine (``engine.weights_routes``) both use
this module, which is why it lives in the floor package. torch is imported inside the functions, so
importing this module costs nothing (``pqrl`` stays import-light).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

__all__ = [
    "WEIGHTS_GROUP_TIMEOUT",
    "broadcast_from_rank0",
    "destroy_group",
    "in_daemon_thread",
    "init_weights_group",
]

T = TypeVar("T")

WEIGHTS_GROUP_TIMEOUT = timedelta(minutes=10)  # rendezvous and every collective of a weights group


def init_weights_group(
    master_address: str,
    master_port: int,
    *,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout: timedelta = WEIGHTS_GROUP_TIMEOUT,
) -> Any:
    """Joins a process group of its own, as SGLang's ``init_custom_process_group`` builds it.

    Not the default group (this process may have none, or one of its own): a TCPStore rendezvous at
    ``master_address:master_port`` (rank 0, the trainer, creates and hosts the store), keys prefixed
    with ``group_name``, so the store keys match SGLang's. Blocks until all ``world_size`` ranks joined.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    store = dist.TCPStore(master_address, master_port, world_size, is_master=rank == 0, timeout=timeout)
    # torch has no public call for a group outside the default one; every RL framework uses this one.
    # Any: being private, its signature differs across torch releases (the options' name, and
    # group_name a str or a GroupName).
    helper: Any = c10d._new_process_group_helper
    options = "backend_options" if "backend_options" in inspect.signature(helper).parameters else "pg_options"
    group, _ = helper(
        world_size,
        rank,
        [],
        c10d.Backend(backend),
        dist.PrefixStore(group_name, store),
        group_name=group_name,
        timeout=timeout,
        **{options: None},
    )
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}  # so dist.broadcast accepts it
    return group


def broadcast_from_rank0(group: Any, tensors: list[Any]) -> None:
    """One broadcast from rank 0 per tensor, in order, all in flight at once; returns when all ended.

    Rank 0 sends its tensors; every other rank receives into its own (of matching dtypes and shapes).
    """
    import torch.distributed as dist

    handles = [dist.broadcast(t, src=0, group=group, async_op=True) for t in tensors]
    for handle in handles:
        handle.wait()


def destroy_group(group: Any) -> None:
    import torch.distributed as dist

    dist.destroy_process_group(group)


def in_daemon_thread(fn: Callable[[], T], *, name: str = "weights-group") -> asyncio.Future[T]:
    """Runs a blocking collective in a daemon thread; the returned future (of the running loop) gets its
    result or exception.

    A collective stuck on a peer that never comes waits out the group's timeout, and must not hold up
    the process's exit (or shutdown) as an executor thread would. Cancelling the future abandons the
    thread's result.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if fut.done():  # cancelled: nobody waits any more
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # handed to the awaiting coroutine
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut
