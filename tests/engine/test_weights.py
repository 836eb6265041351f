"""Weight updates on the built-in engine: new weights at a safe point, the version reported per
response and per token, and abort + client-side resume with versions that change at the right token."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest

from engine.batcher import BatchEngine
from engine.client import EngineClient, SamplingParams, WeightUpdateFailed
from tests.models import chat_prompt, forced_logprobs, max_abs_diff

MAX_LOGPROB_DIFF = 1e-4


async def _until_generated(engine: BatchEngine, rows: int, tokens: int) -> None:
    """Waits until ``rows`` requests are running and each has at least ``tokens`` tokens."""
    while not (len(engine.rows) >= rows and all(len(s.output_ids) >= tokens for s in list(engine.rows))):
        await asyncio.sleep(0.01)


async def test_abort_on_update_returns_partial_tokens_and_resume_switches_version_at_the_right_token(
    updatable, smollm
):
    url, engine, path, new_model = updatable
    old_model, tok = smollm
    prompt = chat_prompt(tok, "Write a long story about a dragon and a knight.")
    n = 30
    params = SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)
    raw_body = {
        "input_ids": prompt,
        "sampling_params": dataclasses.asdict(params),
        "return_logprob": True,
    }
    async with EngineClient(url) as client, httpx.AsyncClient(timeout=120) as http:
        resumed = asyncio.create_task(client.generate(prompt, params, rollout_id="r1"))
        raw = asyncio.create_task(http.post(f"{url}/generate", json=raw_body))
        await _until_generated(engine, rows=2, tokens=4)
        await client.update_weights_from_disk(str(path), 1)
        assert await client.get_weight_version() == {url: 1}

        # The raw request ends with finish reason abort and the tokens the old weights produced.
        out = (await raw).json()
        meta = out["meta_info"]
        assert meta["finish_reason"]["type"] == "abort"
        k_raw = len(out["output_ids"])
        assert 4 <= k_raw < n and meta["weight_version"] == "0"
        assert set(meta["output_token_weight_versions"]) == {"0"}
        old_ref = forced_logprobs(old_model, prompt, out["output_ids"])
        assert max_abs_diff(old_ref, [r[0] for r in meta["output_token_logprobs"]]) < MAX_LOGPROB_DIFF

        # The client resumed its request: old tokens are version 0, every later token version 1.
        g = await resumed
    assert len(g.output_ids) == n and g.finish_reason.type == "length" and g.segments == 2
    k = g.versions.index(1)
    assert k >= 4 and g.versions == [0] * k + [1] * (n - k)
    common = min(k, k_raw)  # the two requests may have joined the batch a step apart
    assert g.output_ids[:common] == out["output_ids"][:common]  # greedy: the same old-weight prefix
    old_lp = forced_logprobs(old_model, prompt, g.output_ids[:k])
    new_lp = forced_logprobs(new_model, prompt, g.output_ids)[k:]  # new weights, whole context
    diff = max_abs_diff(old_lp + new_lp, g.logprobs)
    print(f"max logprob difference across the update: {diff:.2e}")
    assert diff < MAX_LOGPROB_DIFF
    # And the new weights really differ: the old model scores the resumed tokens differently.
    stale = forced_logprobs(old_model, prompt, g.output_ids)[k:]
    assert max_abs_diff(stale, new_lp) > 1e-2


async def test_update_without_requests_then_generations_use_the_new_weights(updatable, smollm):
    url, _, path, new_model = updatable
    tok_prompt = chat_prompt(smollm[1], "Hello!")
    async with EngineClient(url) as client:
        await client.update_weights_from_disk(str(path), 2, abort_all_requests=False)
        assert await client.get_weight_version() == {url: 2}
        g = await client.generate(
            tok_prompt, SamplingParams(temperature=0.9, max_new_tokens=8, sampling_seed=1)
        )
    assert g.versions == [2] * len(g.output_ids)
    ref = forced_logprobs(new_model, tok_prompt, g.output_ids, 0.9)
    assert max_abs_diff(ref, g.logprobs) < MAX_LOGPROB_DIFF


async def test_a_failed_update_keeps_weights_and_version(updatable, tmp_path):
    url, _, _, _ = updatable
    async with EngineClient(url) as client:
        before = await client.get_weight_version()
        with pytest.raises(WeightUpdateFailed, match="no \\*.safetensors"):
            await client.update_weights_from_disk(str(tmp_path), 99)
        assert await client.get_weight_version() == before
    r = httpx.post(f"{url}/update_weights_from_disk", json={"model_path": str(tmp_path), "load_format": "pt"})
    assert r.status_code == 400 and r.json()["success"] is False and "load_format" in r.json()["message"]
