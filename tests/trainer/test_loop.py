"""The trainer's step with real parts: groups from Redis, a GRPO update, the new weights saved and
loaded by the built-in engine over HTTP, the version published in Redis, the groups acknowledged."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch

from engine.client import EngineClient, SamplingParams
from launcher.demo import DemoConfig, sample_group
from pqrl.store import TrajectoryStore
from tests.models import chat_prompt, forced_logprobs
from trainer.config import LoopConfig, StepConfig
from trainer.loop import TrainerLoop


async def test_step_publishes_weights_the_engine_then_serves(updatable, smollm, redis_server, tmp_path):
    url, _, _, _ = updatable
    base, tokenizer = smollm
    torch.manual_seed(0)
    group = sample_group(base, tokenizer, {"id": "t", "question": "What is 3 + 4?", "answer": "7"},
                         DemoConfig(group_size=4, max_new_tokens=10), "loop")  # fmt: skip
    group = [dataclasses.replace(t, reward=float(i < 2)) for i, t in enumerate(group)]
    model = copy.deepcopy(base)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    async with TrajectoryStore(redis_server.url, "loop") as store:
        await store.groups.create_consumer_group("trainer")
        await store.groups.put(group)
        engine = EngineClient(url)
        try:
            cfg = LoopConfig(
                step=StepConfig(temperature=1.0, max_staleness=1),
                groups_per_step=1,
                max_extra_reads=0,
                weights_dir=str(tmp_path / "w"),
            )
            loop = TrainerLoop(model, optimizer, store, engine, cfg, tokenizer=tokenizer)
            metrics = await loop.step(timeout_s=30)
            assert metrics["policy/version"] == 1.0 and metrics["rollout/trajectories_used"] == 4
            policy = await store.policy.get()
            assert policy.version == 1 and policy.weights.endswith("/w/v1")
            assert await store.groups.backlog() == 0, "the consumed group is acknowledged and trimmed"
            assert set((await engine.get_weight_version()).values()) == {1}
            prompt = chat_prompt(tokenizer, "What is 3 + 4?")
            gen = await engine.generate(
                prompt, SamplingParams(temperature=1.0, max_new_tokens=8, sampling_seed=1)
            )
        finally:
            await engine.aclose()
    assert set(gen.versions) == {1}
    served = np.array(gen.logprobs)
    trained = np.array(forced_logprobs(model.eval(), prompt, gen.output_ids))
    old = np.array(forced_logprobs(base, prompt, gen.output_ids))
    assert np.abs(served - trained).max() < 1e-3, "the engine serves the trained weights"
    assert np.abs(served - old).max() > 1e-3, "and not the old ones"


async def test_steps_and_checkpoints_run_on_one_compute_thread(
    tiny_model_dir, redis_server, tmp_path, monkeypatch
):
    """Every step's training and every checkpoint run on the loop's one thread (glibc gives each
    thread its own arena, whose top malloc_trim keeps), never on the event loop's, even while other
    work holds the event loop's pool threads (as publishing and the rollout side do in a job); and
    the loop caps oneDNN's primitive cache unless the user set it."""
    import asyncio
    import os
    import threading

    from transformers import AutoModelForCausalLM

    import trainer.loop as loop_module
    from pqrl.heap import KERNEL_CACHE_CAPACITY
    from tests.conftest import make_trajectory

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    threads: dict[str, set[int]] = {"train": set(), "checkpoint": set()}

    def recorded(name, fn):
        def run(*args, **kwargs):
            threads[name].add(threading.get_ident())
            return fn(*args, **kwargs)

        return run

    monkeypatch.setattr(loop_module, "train_step", recorded("train", loop_module.train_step))
    monkeypatch.setattr(loop_module, "save_checkpoint", recorded("checkpoint", loop_module.save_checkpoint))

    def group(step: int) -> list:
        return [
            dataclasses.replace(
                t := make_trajectory(
                    group_id=f"s{step}",
                    index=i,
                    prompt_len=6,
                    turn_lens=((5, 0),),
                    seed=10 * step + i,
                    reward=float(i % 2),
                ),
                versions=np.where(t.generated == 1, 0, -1).astype(np.int32),
            )
            for i in range(4)
        ]

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    async with TrajectoryStore(redis_server.url, "run1") as store:
        await store.groups.create_consumer_group("trainer")
        cfg = LoopConfig(
            step=StepConfig(temperature=1.0, max_staleness=3), groups_per_step=1, max_extra_reads=0,
            stream=False, weights_dir=str(tmp_path / "w"), ckpt_dir=str(tmp_path / "ckpt"),
        )  # fmt: skip
        loop = TrainerLoop(model, optimizer, store, None, cfg)
        assert int(os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"]) == KERNEL_CACHE_CAPACITY
        release, holders = threading.Event(), []
        for step in range(3):
            # one more pool thread busy each step: a step sent to the pool would land on a new thread
            holders.append(asyncio.create_task(asyncio.to_thread(release.wait, 60)))
            await asyncio.sleep(0.05)
            await store.groups.put(group(step))
            metrics = await loop.step(timeout_s=30)
            assert metrics["rollout/trajectories_used"] == 4
            await loop.checkpoint()
        release.set()
        await asyncio.gather(*holders)
    assert len(threads["train"]) == 1 and threads["train"] == threads["checkpoint"], threads
    assert threading.get_ident() not in threads["train"]
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "8")
    TrainerLoop(model, optimizer, store, None, cfg)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "8", "the user's setting stands"
