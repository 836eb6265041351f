"""``pqrl train`` under ``torchrun``: two FSDP2 ranks (gloo, CPU processes) train the same groups
from a real Redis to the same weights as one process; a two-rank job killed mid-run resumes, from
its checkpoint of gathered weights and name-keyed optimizer state, in a single process; and a
two-rank job publishes its gathered weights to a real engine process over a gloo process group."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from engine.client import EngineClient, SamplingParams
from pqrl.redis_server import RedisServer
from tests.launcher.test_resume import GROUPS, STEPS, _config, _fill, _final, _redis_figures, _train
from tests.models import forced_logprobs, max_abs_diff
from tests.servers import engine_process

# FSDP2 sums the ranks' gradients in another order than one process, and the sharded step reads the
# logits through the full head instead of the fused one: float32 round-off, far below one update.
TOLERANCE = 1e-5


def _run(
    tmp_path: Path, model: Path, name: str, steps: list[dict]
) -> tuple[dict, dict, tuple[int, int, int]]:
    """Runs ``_train`` with each of ``steps``' arguments against one fresh Redis."""
    with RedisServer(data_dir=tmp_path / f"redis-{name}", appendfsync="always") as redis:
        asyncio.run(_fill(redis.url))
        out = tmp_path / name
        config = _config(tmp_path / f"{name}.yaml", model, redis.url, out)
        for kwargs in steps:
            expect = kwargs.pop("expect", 0)
            rc = _train(config, **kwargs)
            assert (rc == 0) == (expect == 0), f"{name} {kwargs}: exit status {rc}"
        figures = asyncio.run(_redis_figures(redis.url))
    state, weights = _final(out)
    return state, weights, figures


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_two_ranks_train_like_one_process_and_resume_anywhere(tiny_model_dir, tmp_path):
    ref_state, ref_weights, _ = _run(tmp_path, tiny_model_dir, "one", [{}])
    assert ref_state["step"] == STEPS

    state, weights, (pending, backlog, _) = _run(tmp_path, tiny_model_dir, "two", [{"ranks": 2}])
    assert state["step"] == STEPS and sorted(state["trained_groups"]) == sorted(ref_state["trained_groups"])
    assert pending == 0 and backlog == 0
    diff = _max_diff(weights, ref_weights)
    print(json.dumps({"two_ranks_vs_one_max_weight_diff": diff}))
    assert diff < TOLERANCE, f"two FSDP2 ranks end {diff} away from one process"

    # killed after step 3's update (the last checkpoint is step 2's), resumed by one process
    state, weights, (pending, backlog, _) = _run(
        tmp_path, tiny_model_dir, "resumed", [{"ranks": 2, "failpoint": "trained:3", "expect": 1}, {}]
    )
    assert state["step"] == STEPS and len(state["trained_groups"]) == GROUPS
    assert sorted(state["trained_groups"]) == sorted(ref_state["trained_groups"]), "each group once"
    assert pending == 0 and backlog == 0
    diff = _max_diff(weights, ref_weights)
    print(json.dumps({"resumed_vs_one_max_weight_diff": diff}))
    assert diff < TOLERANCE, f"the resumed job ends {diff} away from the uninterrupted one"


@pytest.fixture
def tiny_engine(tiny_model_dir, tmp_path) -> Iterator[str]:
    """A built-in engine process serving the tiny model (fp32 on CPU, version 0)."""
    args = ("--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32")
    with engine_process(tmp_path / "engine.log", *args) as url:
        yield url


async def _served(url: str, prompt: list[int]) -> tuple[dict[str, int], list[int], list[float]]:
    async with EngineClient(url) as client:
        g = await client.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True))
        return await client.get_weight_version(), g.output_ids, g.logprobs


def test_a_sharded_job_publishes_over_the_engines_process_group(tiny_model_dir, tiny_engine, tmp_path):
    from transformers import AutoModelForCausalLM

    with RedisServer(data_dir=tmp_path / "redis") as redis:
        asyncio.run(_fill(redis.url))
        config = _config(tmp_path / "job.yaml", tiny_model_dir, redis.url, tmp_path / "out")
        cfg = yaml.safe_load(config.read_text())
        cfg["services"] |= {
            "engines": [tiny_engine],
            "weight_sync": {"method": "distributed", "backend": "gloo"},
        }
        config.write_text(yaml.safe_dump(cfg))
        assert _train(config, ranks=2) == 0
    state, _ = _final(tmp_path / "out")
    ckpt = tmp_path / "out" / "r" / "checkpoints"
    final = AutoModelForCausalLM.from_pretrained(
        ckpt / (ckpt / "latest").read_text().strip() / "model"
    ).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompt = list(range(5, 25))
    versions, output, logprobs = asyncio.run(_served(tiny_engine, prompt))
    assert versions == {tiny_engine: state["policy_version"]} and state["policy_version"] == STEPS
    assert max_abs_diff(forced_logprobs(final, prompt, output), logprobs) < 1e-4, (
        "the engine serves the last step"
    )
    assert max_abs_diff(forced_logprobs(base, prompt, output), logprobs) > 1e-3, "and not the base model"
    assert not (tmp_path / "out" / "r" / "weights").exists(), "nothing went through the disk"
