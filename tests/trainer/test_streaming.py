"""A step accumulated group by group as groups arrive makes the update ``train_step`` makes on all
of them at once, under every loss aggregation and with clipping; it refuses the steps it cannot
reproduce, stops on abort without touching the weights, and counts what it drops."""

from __future__ import annotations

import copy
import dataclasses
import threading

import numpy as np
import pytest
import torch

from tests.conftest import make_trajectory
from tests.models import tiny_llama
from tests.trainer.one_thread import one_torch_thread  # noqa: F401 (autouse: torch on one thread)
from trainer.batch import StepAborted
from trainer.config import AlgorithmConfig, StepConfig
from trainer.step import train_step
from trainer.streaming import StreamingStep, streamable

VERSION = 3  # make_trajectory's tokens were generated at version 3: no staleness
LR = 1e3  # SGD: the update is the gradient, scaled to be well above float32 noise


def _group(name: str, rewards: list[float], turn_lens=((4, 3), (2, 0)), seed: int = 0) -> list:
    out = []
    for i, r in enumerate(rewards):
        t = make_trajectory(
            group_id=name, index=i, seed=seed + i, reward=r, turn_lens=turn_lens, prompt_len=6
        )
        if out:  # one prompt per group
            tokens = t.tokens.copy()
            tokens[:6] = out[0].tokens[:6]
            t = dataclasses.replace(t, tokens=tokens)
        out.append(dataclasses.replace(t, truncation=None))
    return out


GROUPS = [
    _group("a", [1.0, 0.0, 0.0, 1.0], seed=0),
    _group("flat", [1.0, 1.0, 1.0], seed=10),
    _group("b", [0.0, 1.0, 0.5], turn_lens=((7, 2), (3, 0)), seed=20),
    _group("c", [0.0, 0.0, 1.0, 0.0, 1.0], turn_lens=((2, 1), (5, 0)), seed=30),
]


COMPARED = (  # metrics that must not depend on how the groups arrived
    *("losses/pg_loss", "losses/grad_norm", "losses/agg_normalizer", "losses/clipfrac", "policy/entropy"),
    *("advantages/abs_mean", "rollout/trajectories_used", "dropped/no_signal_groups", "perf/tokens"),
)


ALGORITHM = {f.name for f in dataclasses.fields(AlgorithmConfig)}


def _cfg(**kw) -> StepConfig:
    alg = {k: kw.pop(k) for k in list(kw) if k in ALGORITHM}
    return StepConfig(temperature=1.0, max_staleness=1, algorithm=AlgorithmConfig(**alg), **kw)


@pytest.fixture(scope="module")
def base():
    return tiny_llama(49152, hidden_size=16, layers=2, heads=2, positions=64)


def _both(base, cfg: StepConfig, arrivals: list[list]) -> tuple[dict, dict, list, list]:
    batch_model, stream_model = copy.deepcopy(base), copy.deepcopy(base)
    batch = train_step(batch_model, torch.optim.SGD(batch_model.parameters(), lr=LR),
                       [g for a in arrivals for g in a], VERSION, cfg)  # fmt: skip
    step = StreamingStep(stream_model, torch.optim.SGD(stream_model.parameters(), lr=LR), VERSION, cfg)
    for groups in arrivals:
        step.add(groups)
    streamed = step.finish()
    return batch, streamed, list(batch_model.parameters()), list(stream_model.parameters())


@pytest.mark.parametrize(
    "agg",
    [
        {"loss_agg": "token_mean"},
        {"loss_agg": "seq_mean_token_mean"},
        {"loss_agg": "seq_mean_token_sum"},
        {"loss_agg": "seq_mean_token_sum_norm", "loss_agg_tokens": 16},
    ],  # fmt: skip
)
@pytest.mark.parametrize("max_grad_norm", [1e3, 1e-2])  # unclipped, and clipped after the division by D
def test_groups_added_one_by_one_give_the_batch_update(base, agg, max_grad_norm):
    cfg = _cfg(max_grad_norm=max_grad_norm, **agg)
    batch, streamed, want, got = _both(base, cfg, [[GROUPS[0]], [GROUPS[1], GROUPS[2]], [GROUPS[3]]])
    start = list(base.parameters())
    moved = max(float((w - s).detach().abs().max()) for w, s in zip(want, start, strict=True))
    gap = max(float((w - g).detach().abs().max()) for w, g in zip(want, got, strict=True))
    assert moved > 1e-4, "the batch step moved the weights"
    assert gap <= 1e-5 * moved, f"streamed update differs by {gap:.3g} (the update is {moved:.3g})"
    for k in COMPARED:
        assert streamed[k] == pytest.approx(batch[k], rel=1e-5, abs=1e-7), k
    assert set(batch) == set(streamed), "the same metrics"
    assert streamed["perf/micro_batches"] == 3, "one pass per arrival"


@pytest.mark.parametrize(
    "alg",
    [
        {"entropy_coef": 0.01},
        {"is_level": "sequence"},
        {"is_mode": "mask"},
        {"advantage": "rloo"},
        {"advantage": "dr_grpo", "loss_agg": "seq_mean_token_sum_norm", "loss_agg_tokens": 16},
        {"scale_by_std": False, "dual_clip_c": 3.0},
        {"overlong_buffer": 4, "context_tokens": 20},
        {"packing": False, "fused_logprobs": False},
    ],
)
def test_the_algorithm_options_stream_to_the_same_update(base, alg):
    # behaviour logprobs near the random model's own (log 1/V), or a sequence's weight underflows to 0
    near = [
        [dataclasses.replace(t, behavior_logprobs=t.generated * np.float32(-10.8)) for t in g] for g in GROUPS
    ]
    batch, streamed, want, got = _both(base, _cfg(**alg), [[near[0]], [near[2], near[3]]])
    moved = max(float((w - s).detach().abs().max()) for w, s in zip(want, base.parameters(), strict=True))
    gap = max(float((w - g).detach().abs().max()) for w, g in zip(want, got, strict=True))
    assert moved > 1e-4 and gap <= 1e-5 * moved, (moved, gap)
    assert set(batch) == set(streamed)
    for k, v in batch.items():
        if not k.startswith("perf/"):  # time, and the passes, depend on the arrivals
            assert streamed[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k


def test_the_steps_it_cannot_reproduce_are_refused_with_the_reason():
    assert streamable(_cfg()) is None
    assert "ppo_epochs" in streamable(_cfg(ppo_epochs=2))
    assert "reinforce_baseline" in streamable(_cfg(advantage="reinforce_baseline"))
    assert "sharded" in streamable(_cfg(), sharded=True)
    assert "reference" in streamable(_cfg(kl_coef=0.1))
    assert "critic" in streamable(_cfg(), critic=object())
    assert "reference" in streamable(_cfg(), ref_model=object())
    with pytest.raises(ValueError, match="minibatches"):
        StreamingStep(
            tiny_llama(64), torch.optim.SGD(tiny_llama(64).parameters(), lr=1.0), 0, _cfg(minibatches=2)
        )


def test_an_abort_stops_it_before_the_weights_change(base):
    model = copy.deepcopy(base)
    abort = threading.Event()
    step = StreamingStep(model, torch.optim.SGD(model.parameters(), lr=1.0), VERSION, _cfg(), abort=abort)
    step.add([GROUPS[0]])
    abort.set()
    with pytest.raises(StepAborted):
        step.add([GROUPS[2]])
    with pytest.raises(StepAborted):
        step.finish()
    assert all(torch.equal(a, b) for a, b in zip(base.parameters(), model.parameters(), strict=True))
    fresh = StreamingStep(model, torch.optim.SGD(model.parameters(), lr=1.0), VERSION, _cfg())
    assert all(p.grad is None for p in model.parameters()), "the next step starts from no gradient"
    fresh.add([GROUPS[0]])
    batch_model = copy.deepcopy(base)
    train_step(batch_model, torch.optim.SGD(batch_model.parameters(), lr=1.0), [GROUPS[0]], VERSION, _cfg())
    fresh.finish()
    gap = max(
        float((a - b).detach().abs().max())
        for a, b in zip(batch_model.parameters(), model.parameters(), strict=True)
    )
    assert gap < 1e-6, "the aborted step's gradient did not leak into the next"


def test_without_a_usable_group_nothing_changes_and_the_drops_are_counted(base):
    model = copy.deepcopy(base)
    step = StreamingStep(model, torch.optim.SGD(model.parameters(), lr=1.0), VERSION + 5, _cfg())
    step.add([GROUPS[1]])  # stale at this version, and flat
    step.add([GROUPS[0]])
    m = step.finish()
    assert m["rollout/trajectories_used"] == 0 and m["dropped/stale"] == 7
    assert m["dropped/groups_too_few_valid"] == 2
    assert all(torch.equal(a, b) for a, b in zip(base.parameters(), model.parameters(), strict=True))


# ---------------------------------------------------------------- in the trainer loop, through Redis


def _loop(store, model, tmp_path, name: str, stream: bool):
    from trainer.config import LoopConfig
    from trainer.loop import TrainerLoop

    cfg = LoopConfig(step=_cfg(), groups_per_step=2, max_extra_reads=1, read_block_ms=50, stream=stream,
                     weights_dir=str(tmp_path / name), consumer=name)  # fmt: skip
    return TrainerLoop(model, torch.optim.SGD(model.parameters(), lr=LR), store, None, cfg)


def _in_run(group: list, run: str) -> list:
    return [dataclasses.replace(t, run_id=run) for t in group]


async def _wait_for(condition, what: str) -> None:
    import asyncio

    for _ in range(400):
        if condition():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"timed out waiting until {what}")


async def test_the_loop_trains_a_group_before_the_next_arrives_and_makes_the_batch_update(
    base, redis_server, tmp_path
):
    import asyncio

    from pqrl.store import TrajectoryStore

    streamed, batched = copy.deepcopy(base), copy.deepcopy(base)
    async with TrajectoryStore(redis_server.url, "st") as store:
        await store.policy.publish("/v3", version=VERSION)
        loop = _loop(store, streamed, tmp_path, "s", stream=True)
        assert loop.streams
        await store.groups.put(_in_run(GROUPS[0], "st"))
        step = asyncio.create_task(loop.step(timeout_s=30))
        await _wait_for(
            lambda: any(p.grad is not None for p in streamed.parameters()), "the first group is in"
        )
        assert not step.done(), "the step waits for its second group, the first already backpropagated"
        await store.groups.put(_in_run(GROUPS[1], "st"))  # flat: its place goes back, another is read
        for _ in range(400):
            if (await store.gate.state())["rejected"] == 1:
                break
            await asyncio.sleep(0.025)
        assert (await store.gate.state())["rejected"] == 1 and not step.done(), "freed while the step waits"
        await store.groups.put(_in_run(GROUPS[2], "st"))
        m = await step
        assert m["rollout/trajectories_used"] == 7 and m["dropped/no_signal_groups"] == 1
        assert loop.state.trained_groups == ["a", "flat", "b"]
        assert (await store.gate.state())["rejected"] == 1, "not counted twice"
    async with TrajectoryStore(redis_server.url, "bt") as store:
        await store.policy.publish("/v3", version=VERSION)
        loop = _loop(store, batched, tmp_path, "b", stream=False)
        for g in GROUPS[:3]:
            await store.groups.put(_in_run(g, "bt"))
        await loop.step(timeout_s=30)
    moved = max(
        float((a - b).detach().abs().max())
        for a, b in zip(batched.parameters(), base.parameters(), strict=True)
    )
    gap = max(
        float((a - b).detach().abs().max())
        for a, b in zip(batched.parameters(), streamed.parameters(), strict=True)
    )
    assert moved > 1e-4 and gap <= 1e-5 * moved, (moved, gap)


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "batch"])
@pytest.mark.parametrize("cancel", [True, False], ids=["cancelled", "abort_only"])
async def test_a_step_stopped_while_it_waits_leaves_weights_and_state_as_they_were(
    base, redis_server, tmp_path, stream, cancel
):
    """Streaming, the first group is already backpropagated when the step is stopped. A cancel can
    be lost on its way (the Redis client swallows one now and then), so ``abort()`` alone must end
    a waiting step too. The next step in the same process reads the stopped step's group again."""
    import asyncio

    from pqrl.store import TrajectoryStore

    model = copy.deepcopy(base)
    async with TrajectoryStore(redis_server.url, "cx") as store:
        await store.policy.publish("/v3", version=VERSION)
        loop = _loop(store, model, tmp_path, "c", stream=stream)
        await store.groups.put(_in_run(GROUPS[0], "cx"))
        step = asyncio.create_task(loop.step(timeout_s=30))
        await _wait_for(lambda: loop._waiting and bool(loop._consumed), "the step waits for its second group")
        if stream:
            assert any(p.grad is not None for p in model.parameters()), "the first group is in"
        assert loop.abort() is False, "waiting: the caller may cancel"
        if cancel:
            step.cancel()
        with pytest.raises(asyncio.CancelledError if cancel else StepAborted):
            await asyncio.wait_for(step, timeout=10)
        assert all(torch.equal(a, b) for a, b in zip(base.parameters(), model.parameters(), strict=True))
        assert (await store.policy.get()).version == VERSION, "nothing published"
        assert loop.state.step == 0 and loop.state.trained_groups == []
        assert await store.groups.pending("trainer") == 1, "the group read stays pending: redelivered later"
        await store.groups.put(_in_run(GROUPS[2], "cx"))
        m = await asyncio.wait_for(loop.step(timeout_s=30), timeout=60)
        assert m["rollout/trajectories_used"] == 7, "the next step trains the stopped step's group too"
        assert loop.state.trained_groups == [GROUPS[0][0].group_id, GROUPS[2][0].group_id]
