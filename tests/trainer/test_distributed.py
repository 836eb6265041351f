"""FSDP2 on 2 gloo processes gives the single-process gradient and update of the same step.

The comparison is the test: FSDP2 on gloo has reduced gradients by SUM where it promised AVG
(in some torch releases), so the two-process step is launched with torchrun and checked against
one process running the whole batch, parameter by parameter.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer import dist_worker as w
from trainer import distributed

ROOT = Path(__file__).resolve().parents[2]
WORLD = 2


@pytest.fixture(scope="module")
def two_rank_step(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("dist") / "step.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
           str(Path(w.__file__)), str(out)]  # fmt: skip
    # Own session: on a hang, kill torchrun *and* its workers (a collective mismatch deadlocks).
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"torchrun hung (collective mismatch?):\n{stderr[-6000:]}")
    assert proc.returncode == 0, stderr[-6000:]
    return torch.load(out, weights_only=True)


@pytest.fixture(scope="module")
def one_process_step() -> dict:
    """The whole batch in one process, one micro-batch, no FSDP, no helpers from distributed.py."""
    torch.set_num_threads(1)
    model = w.tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=w.LR, eps=w.ADAM_EPS)
    trajs, advs = w.flatten_with_advantages(w.make_groups())
    w.summed_token_loss(model, w.collate(trajs, advs), normalizer=None).backward()  # token-mean
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), w.MAX_GRAD_NORM)
    optimizer.step()
    return {
        "grads": grads,
        "grad_norm": grad_norm,
        "params": {n: p.detach() for n, p in model.named_parameters()},
    }


def _max_diffs(got: dict, want: dict) -> tuple[float, float]:
    assert got.keys() == want.keys()
    abs_diff = max(float((got[n] - want[n]).abs().max()) for n in want)
    rel_diff = max(float((got[n] - want[n]).norm() / want[n].norm().clamp(min=1e-12)) for n in want)
    return abs_diff, rel_diff


def test_every_rank_receives_rank_0s_groups_and_runs_as_many_passes(two_rank_step):
    received_ok, passes, trajectories = two_rank_step["checks"].T.tolist()
    assert received_ok == [1.0, 1.0]
    assert sum(trajectories) == sum(len(g) for g in w.make_groups())
    assert passes[0] == passes[1]
    real = [-(-int(n) // w.MICRO_BATCH) for n in trajectories]
    assert real[0] != real[1], "the split should make one rank run an empty pass; change MICRO_BATCH"


def test_fsdp2_gradients_equal_the_single_process_gradients(two_rank_step, one_process_step):
    got, want = two_rank_step["grads"], one_process_step["grads"]
    abs_diff, rel_diff = _max_diffs(got, want)
    print(f"\ngradients: max abs diff {abs_diff:.3g}, max relative (per-tensor norm) diff {rel_diff:.3g}")
    assert all(want[n].abs().max() > 0 for n in want), "every parameter should get a gradient"
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
    torch.testing.assert_close(two_rank_step["grad_norm"], one_process_step["grad_norm"], rtol=1e-5, atol=0)


def test_one_clipped_adamw_step_gives_the_same_parameters(two_rank_step, one_process_step):
    assert float(one_process_step["grad_norm"]) > w.MAX_GRAD_NORM, "clipping should be active"
    before = dict(w.tiny_model().named_parameters())
    got, want = two_rank_step["params"], one_process_step["params"]
    abs_diff, _ = _max_diffs(got, want)
    print(f"\nparameters after AdamW: max abs diff {abs_diff:.3g} (lr {w.LR})")
    for n in want:
        assert not torch.equal(want[n], before[n]), f"{n} did not move"
        torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


def test_raw_fsdp2_averages_on_gloo_so_shard_must_sum(two_rank_step):
    # Rank r's gradient is r + 1: the mean is 1.5, the sum 3.0. A torch where gloo runs AVG as SUM
    # reports 3.0 here; shard() forces SUM and is exact either way.
    assert two_rank_step["raw_reduction"] == pytest.approx(1.5, abs=1e-6)


# --- world of one: every function is a pass-through --------------------------------------------


def test_world_of_one_is_a_pass_through():
    ctx = distributed.init_from_env({})
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.distributed) == (0, 1, True, False)
    assert not torch.distributed.is_initialized()
    model = torch.nn.Linear(2, 2)
    assert distributed.shard(model, ctx) is model and not hasattr(model.weight, "full_tensor")
    groups = w.make_groups()
    got = distributed.broadcast_groups(groups, ctx)
    assert [[t.id for t in g] for g in got] == [[t.id for t in g] for g in groups]
    assert got[0][0] is groups[0][0]
    assert distributed.broadcast_groups(None, ctx) == []
    assert distributed.shard_of(list("abcde"), ctx) == list("abcde")
    assert distributed.shard_of(list("abcde"), ctx, cost=len) == list("abcde")
    assert (
        distributed.all_reduce_scalar(7.0, ctx) == 7.0
        and distributed.all_reduce_scalar(7.0, ctx, "max") == 7.0
    )
    assert distributed.equalize_passes([[1], [2]], ctx) == [[1], [2]]
    distributed.shutdown(ctx)
    assert distributed.init_from_env({"WORLD_SIZE": "1", "RANK": "0"}).world_size == 1


def test_a_world_without_a_master_address_fails_loudly():
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        distributed.init_from_env({"WORLD_SIZE": "2", "RANK": "1"})


# --- pure rules --------------------------------------------------------------------------------


def _shares(items, world, **kw):
    return [
        distributed.shard_of(items, distributed.DistContext(rank=r, world_size=world), **kw)
        for r in range(world)
    ]


def test_shares_partition_the_items_in_order():
    items = list(range(10))
    strided = _shares(items, 3)
    assert strided == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    lengths = [90, 10, 10, 10, 10, 10, 10, 10, 10, 30]
    balanced = _shares(items, 3, cost=lambda i: lengths[i])
    assert sorted(sum(balanced, [])) == items and all(s == sorted(s) for s in balanced)
    loads = [sum(lengths[i] for i in s) for s in balanced]
    assert loads == [90, 50, 60] or sorted(loads) == [50, 60, 90], loads
    assert max(loads) == 90  # the long trajectory alone; strided would put 90 + 3 others together
    assert _shares([1], 2) == [[1], []]  # a rank may get nothing (then it runs empty passes)


def test_normalizer_makes_reduced_rank_gradients_the_token_mean_gradient():
    # 3 ranks with summed token losses S_r over n_r tokens; single process: sum(S) / N.
    S, n = torch.tensor([3.0, 5.0, 1.0]), torch.tensor([4.0, 7.0, 2.0])
    N = float(n.sum())
    want = float(S.sum()) / N
    by_sum = float((S / distributed.rank_normalizer(N, 3, "sum")).sum())
    by_avg = float((S / distributed.rank_normalizer(N, 3, "avg")).mean())
    assert by_sum == pytest.approx(want) and by_avg == pytest.approx(want)
    assert float((S / n.sum()).mean()) != pytest.approx(want)  # global count under AVG: W times too small
    with pytest.raises(ValueError):
        distributed.rank_normalizer(N, 3, "mean")
