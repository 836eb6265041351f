"""SGLang's distributed weight path end to end: a `pqrl engine serve` process joins the trainer's gloo
group, receives SmolLM2-135M's parameters by broadcast, and serves them as the new version; a
generation running across the update is aborted and resumed with versions exact per token."""

from __future__ import annotations

import asyncio
import copy
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from engine.client import EngineClient, SamplingParams, WeightUpdateFailed
from pqrl.redis_server import free_port
from tests.models import chat_prompt, forced_logprobs, max_abs_diff
from tests.servers import engine_process
from trainer.weight_sync import DistributedWeightSync

PQRL = str(Path(sys.executable).parent / "pqrl")
MAX_LOGPROB_DIFF = 1e-4


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory) -> Iterator[str]:
    """A built-in engine in its own process (fp32 on CPU, version 0)."""
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    with engine_process(log, "--device", "cpu", "--dtype", "float32") as url:
        yield url


def _perturbed(model):
    new = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            if p.ndim == 2:  # a different but still fluent policy
                p.add_(torch.randn(p.shape, generator=gen) * 0.05 * p.std())
    return new


class _Params:
    """A stand-in model with the given parameters (a malformed push)."""

    def __init__(self, params: dict[str, torch.Tensor]) -> None:
        self.params = params

    def named_parameters(self):
        return iter(self.params.items())


async def _generated_tokens(http: httpx.AsyncClient, url: str) -> int:
    return (await http.get(f"{url}/engine_stats")).json()["generated_tokens"]


async def test_push_over_gloo_swaps_weights_versions_and_resumes_generation(engine_url, smollm):
    base, tok = smollm
    trained = _perturbed(base)
    prompt = chat_prompt(tok, "Write a long story about a dragon and a knight.")
    n = 128  # long enough to be running when the weights swap, even on a busy machine
    long = SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)
    async with EngineClient(engine_url) as client, httpx.AsyncClient(timeout=30) as http:
        sync = DistributedWeightSync(client, master_port=free_port(), backend="gloo", timeout_s=120)
        async with sync:
            before = await _generated_tokens(http, engine_url)
            running = asyncio.create_task(client.generate(prompt, long))
            while await _generated_tokens(http, engine_url) < before + 4:
                await asyncio.sleep(0.05)
            await sync.push(trained, 1)
            print(
                f"SmolLM2-135M over gloo: broadcast {sync.last_broadcast_s:.2f} s, "
                f"push until the engine answered {sync.last_push_s:.2f} s"
            )
            # (a) the engine serves version 1.
            assert await client.get_weight_version() == {engine_url: 1}

            # The running generation was aborted at the swap and resumed: versions change at one token.
            g = await running
            assert g.segments == 2 and len(g.output_ids) == n
            k = g.versions.index(1)
            assert k >= 4 and g.versions == [0] * k + [1] * (n - k)
            old_lp = forced_logprobs(base, prompt, g.output_ids[:k])
            new_lp = forced_logprobs(trained, prompt, g.output_ids)[k:]
            assert max_abs_diff(old_lp + new_lp, g.logprobs) < MAX_LOGPROB_DIFF

            # (b) a greedy generation now scores as a fresh forward pass of the pushed weights.
            short = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
            g = await client.generate(prompt, short)
            assert g.versions == [1] * 12
            assert max_abs_diff(forced_logprobs(trained, prompt, g.output_ids), g.logprobs) < MAX_LOGPROB_DIFF
            assert max_abs_diff(forced_logprobs(base, prompt, g.output_ids), g.logprobs) > 1e-2

            # (c) a wrong shape is refused whole (after receiving, so the group stays in step): the
            # served weights and version stay, and the next push works.
            bad = _Params(
                {
                    "model.norm.weight": torch.zeros(576),  # a right one, which must not be applied either
                    "model.layers.0.mlp.up_proj.weight": torch.zeros(7, 576),
                }
            )
            with pytest.raises(WeightUpdateFailed, match=r"shape mismatch.*up_proj.*\(7, 576\)"):
                await sync.push(bad, 2)
            with pytest.raises(WeightUpdateFailed, match="tensors the model does not have"):
                await sync.push(_Params({"lm_head.bias": torch.zeros(3)}), 2)
            assert await client.get_weight_version() == {engine_url: 1}
            again = await client.generate(prompt, short)
            assert again.output_ids == g.output_ids and max_abs_diff(again.logprobs, g.logprobs) < 1e-5

            # A subset of the tensors is a valid update (SGLang's buckets): the version follows.
            norm = dict(base.named_parameters())["model.norm.weight"]
            await sync.push(_Params({"model.norm.weight": norm}), 2)
            assert await client.get_weight_version() == {engine_url: 2}


def test_group_requests_that_cannot_work_are_clear_errors(engine_url):
    def post(path: str, body: dict) -> httpx.Response:
        return httpx.post(f"{engine_url}{path}", json=body, timeout=30)

    group = {"master_address": "127.0.0.1", "master_port": free_port(), "rank_offset": 1, "world_size": 2}
    r = post("/init_weights_update_group", {**group, "backend": "nccl"})
    assert r.status_code == 400 and r.json()["success"] is False
    assert "'nccl' needs CUDA" in r.json()["message"] and "gloo" in r.json()["message"]
    r = post("/init_weights_update_group", {**group, "backend": "mpi"})
    assert r.status_code == 400 and "not supported" in r.json()["message"]
    r = post("/init_weights_update_group", {**group, "backend": "gloo", "rank_offset": 0})
    assert r.status_code == 400 and "rank 0 is the trainer" in r.json()["message"]
    body = {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[576]], "group_name": "nope"}
    r = post("/update_weights_from_distributed", body)
    assert r.status_code == 400 and "call /init_weights_update_group first" in r.json()["message"]
    r = post("/destroy_weights_update_group", {"group_name": "nope"})
    assert r.status_code == 400 and r.json() == {"success": False, "message": "no group 'nope' to destroy"}
