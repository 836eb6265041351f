"""The built-in engine over real HTTP with the real SmolLM2-135M-Instruct: SGLang's fields, the
logprob convention against a fresh forward pass, finish reasons, batching, pausing, the SGLang path."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest
import torch

from engine.config import EngineConfig, ServeConfig, add_serve_arguments
from engine.sampling_params import SamplingParams
from engine.serve_command import serve
from engine.sglang import SGLangNotInstalled, launch_sglang, sglang_command
from engine.token_sampling import sample_tokens
from tests.models import chat_prompt, forced_logprobs, max_abs_diff

MAX_LOGPROB_DIFF = 1e-4


def _post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/generate", json=body, timeout=120)


def _greedy(url: str, prompt: list[int], n: int, **params) -> dict:
    body = {
        "input_ids": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": n, **params},
        "return_logprob": True,
    }
    r = _post(url, body)
    assert r.status_code == 200, r.text
    return r.json()


def test_generate_fields_and_logprobs_match_a_fresh_forward_pass(served, smollm):
    url, _ = served
    model, tok = smollm
    prompt = chat_prompt(tok, "Name a fruit.")
    worst = 0.0
    for temperature in (0.7, 1.3, 0.0):
        body = {
            "input_ids": prompt,
            "sampling_params": {"temperature": temperature, "max_new_tokens": 8, "sampling_seed": 3},
            "return_logprob": True,
            "rid": f"fields-{temperature}",
        }
        out = _post(url, body).json()
        meta = out["meta_info"]
        assert set(out) == {"text", "output_ids", "meta_info"}
        assert meta["id"] == f"fields-{temperature}"
        assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == len(out["output_ids"])
        assert meta["weight_version"] == "0"
        assert meta["finish_reason"]["type"] in ("stop", "length")
        rows = meta["output_token_logprobs"]
        assert [r[1] for r in rows] == out["output_ids"] and all(r[2] is None for r in rows)
        # SGLang's convention: log_softmax(logits / T) of the sampled token; greedy is scored at T = 1.
        ref = forced_logprobs(model, prompt, out["output_ids"], temperature or 1.0)
        diff = max_abs_diff(ref, [r[0] for r in rows])
        worst = max(worst, diff)
    print(f"max |engine - forward| logprob difference: {worst:.2e}")
    assert worst < MAX_LOGPROB_DIFF


def test_finish_reasons_stop_token_stop_string_length_eos(served, smollm):
    url, _ = served
    _, tok = smollm
    prompt = chat_prompt(tok, "List the days of the week.")
    free = _greedy(url, prompt, 12, ignore_eos=True)
    ids, text = free["output_ids"], free["text"]
    assert free["meta_info"]["finish_reason"] == {"type": "length", "length": 12}

    # A stop token id ends generation at its first occurrence and stays in output_ids.
    stop_id = ids[3]
    first = ids.index(stop_id)
    out = _greedy(url, prompt, 12, stop_token_ids=[stop_id])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert out["output_ids"] == ids[: first + 1]

    # A stop string is matched on the decoded text and trimmed from it unless no_stop_trim.
    word = text.strip().split()[2]
    out = _greedy(url, prompt, 12, stop=[word])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert out["text"] == text[: text.find(word)]
    kept = _greedy(url, prompt, 12, stop=[word], no_stop_trim=True)
    assert kept["text"].endswith(word) and kept["output_ids"] == out["output_ids"]

    # The model's EOS (<|im_end|>) stops like a stop token, unless ignore_eos.
    short = chat_prompt(tok, "Say hi.")
    out = _greedy(url, short, 40)
    eos = out["output_ids"][-1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}
    assert tok.convert_ids_to_tokens(eos) == "<|im_end|>" and "<|im_end|>" not in out["text"]
    longer = _greedy(url, short, len(out["output_ids"]) + 2, ignore_eos=True)
    assert longer["meta_info"]["finish_reason"]["type"] == "length"
    assert longer["output_ids"][: len(out["output_ids"])] == out["output_ids"]


async def test_greedy_is_deterministic_and_batched_equals_unbatched(served, smollm):
    url, engine = served
    _, tok = smollm
    questions = [
        "Hi",
        "What is the capital of France? Answer briefly please.",
        "2+2?",
        "Name three colors of the rainbow.",
    ]
    prompts = [chat_prompt(tok, q) for q in questions]
    assert len({len(p) for p in prompts}) == len(prompts)  # different lengths: real left padding
    alone = [_greedy(url, p, 10, ignore_eos=True)["output_ids"] for p in prompts]
    assert _greedy(url, prompts[0], 10, ignore_eos=True)["output_ids"] == alone[0]

    steps = engine.stats.max_batch_rows
    async with httpx.AsyncClient(timeout=120) as http:

        async def one(p: list[int], delay: float) -> list[int]:
            await asyncio.sleep(delay)  # staggered: later rows join a running batch
            body = {
                "input_ids": p,
                "sampling_params": {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True},
            }
            return (await http.post(f"{url}/generate", json=body)).json()["output_ids"]

        together = await asyncio.gather(*(one(p, 0.05 * i) for i, p in enumerate(prompts)))
    assert together == alone
    assert engine.stats.max_batch_rows >= max(steps, 2)

    # The batch form of the API (a list of prompts) gives the same tokens.
    body = {
        "input_ids": prompts,
        "sampling_params": {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True},
    }
    batch = _post(url, body).json()
    assert [b["output_ids"] for b in batch] == alone


async def test_concurrent_requests_share_decode_rounds(served, smollm):
    url, engine = served
    _, tok = smollm
    prompts = [chat_prompt(tok, f"Tell me about the number {i}.") for i in range(8)]
    params = {"temperature": 0.8, "max_new_tokens": 6, "ignore_eos": True}
    before = engine.stats.decode_steps
    for i, p in enumerate(prompts):
        _post(url, {"input_ids": p, "sampling_params": {**params, "sampling_seed": i}})
    sequential = engine.stats.decode_steps - before

    before = engine.stats.decode_steps
    async with httpx.AsyncClient(timeout=120) as http:
        outs = await asyncio.gather(
            *(
                http.post(
                    f"{url}/generate",
                    json={"input_ids": p, "sampling_params": {**params, "sampling_seed": i}},
                )
                for i, p in enumerate(prompts)
            )
        )
    concurrent = engine.stats.decode_steps - before
    assert all(len(o.json()["output_ids"]) == 6 for o in outs)
    assert sequential == 8 * 5  # the prefill samples each request's first token
    assert concurrent < sequential / 2, (concurrent, sequential)
    stats = httpx.get(f"{url}/engine_stats").json()
    assert stats["decode_steps"] == engine.stats.decode_steps and stats["max_batch_rows"] >= 4


def test_invalid_requests_are_clear_errors(served, smollm):
    url, _ = served
    _, tok = smollm
    prompt = chat_prompt(tok, "Hi")
    r = _post(url, {"input_ids": prompt, "stream": True})
    assert r.status_code == 400 and r.json()["error"] == "stream_unsupported"
    r = _post(url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2, "frequency_penalty": 1}})
    assert r.status_code == 422 and "frequency_penalty" in r.json()["detail"]
    r = _post(url, {"input_ids": [len(tok) + 5]})
    assert r.status_code == 400 and "token ids" in r.json()["detail"]
    r = _post(url, {"input_ids": prompt, "sampling_params": {"top_k": 0}})
    assert r.status_code == 422 and "top_k" in r.json()["detail"]
    r = _post(url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 0}})
    assert r.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


async def test_pause_modes_and_control_routes(served, smollm):
    url, engine = served
    model, tok = smollm
    prompt = chat_prompt(tok, "Write a long story about a dragon.")
    reference = _greedy(url, prompt, 24, ignore_eos=True)
    body = {
        "input_ids": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True},
        "return_logprob": True,
    }
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:

        async def started(min_tokens: int = 3) -> None:
            start = engine.stats.generated_tokens
            while engine.stats.generated_tokens - start < min_tokens:
                await asyncio.sleep(0.01)

        # retract: the request leaves the batch, keeps its tokens, and is re-prefilled on continue.
        task = asyncio.create_task(http.post("/generate", json=body))
        await started()
        assert (await http.post("/pause_generation", json={"mode": "retract"})).status_code == 200
        stats = (await http.get("/engine_stats")).json()
        assert stats["paused"] and stats["running"] == 0 and stats["waiting"] == 1
        await http.post("/continue_generation")
        out = (await task).json()
        assert out["output_ids"] == reference["output_ids"]
        ref = forced_logprobs(model, prompt, out["output_ids"])
        assert max_abs_diff(ref, [r[0] for r in out["meta_info"]["output_token_logprobs"]]) < MAX_LOGPROB_DIFF

        # in_place: nothing moves until continue.
        task = asyncio.create_task(http.post("/generate", json=body))
        await started()
        await http.post("/pause_generation", json={"mode": "in_place"})
        frozen = engine.stats.generated_tokens
        await asyncio.sleep(0.3)
        assert engine.stats.generated_tokens == frozen and not task.done()
        await http.post("/continue_generation")
        assert (await task).json()["output_ids"] == reference["output_ids"]

        # abort: in-flight requests return their tokens so far; new ones wait for continue.
        task = asyncio.create_task(http.post("/generate", json=body))
        await started()
        await http.post("/pause_generation", json={"mode": "abort"})
        aborted = (await task).json()
        assert aborted["meta_info"]["finish_reason"]["type"] == "abort"
        n = len(aborted["output_ids"])
        assert 0 < n < 24 and aborted["output_ids"] == reference["output_ids"][:n]
        waiting = asyncio.create_task(http.post("/generate", json=body))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await http.post("/continue_generation")
        assert (await waiting).json()["output_ids"] == reference["output_ids"]

        # abort_request by rid, and the small routes.
        task = asyncio.create_task(http.post("/generate", json={**body, "rid": "victim"}))
        await started()
        assert (await http.post("/abort_request", json={"rid": "victim"})).json()["num_aborted"] == 1
        assert (await task).json()["meta_info"]["finish_reason"]["type"] == "abort"
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/get_weight_version")).json() == {"weight_version": "0"}
        assert (await http.get("/flush_cache")).json()["success"] is True
        assert (await http.post("/flush_cache")).status_code == 200
        assert (await http.get("/get_model_info")).json()["is_generation"] is True


async def test_a_client_that_goes_away_stops_its_generation(served):
    url, engine = served
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
    async with httpx.AsyncClient(timeout=0.3) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(f"{url}/generate", json=body)
    for _ in range(300):  # the server notices within a second or so and aborts the request
        if not engine.rows:
            break
        await asyncio.sleep(0.01)
    assert not engine.rows


def test_sampling_convention_without_renormalization():
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.5, top_k=1),
        SamplingParams(temperature=2.0, top_p=0.3),
        SamplingParams(temperature=1.0, top_k=5, top_p=0.9),
    ]
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    tokens, logprobs = sample_tokens(logits, params, gens)
    assert tokens[0] == logits[0].argmax() and tokens[1] == logits[1].argmax()
    temps = torch.tensor([1.0, 0.5, 2.0, 1.0])[:, None]
    expected = torch.log_softmax(logits / temps, -1).gather(1, tokens[:, None])[:, 0]
    assert torch.allclose(logprobs, expected)  # the unfiltered distribution, not the top-k/top-p one
    assert tokens[3] in logits[3].topk(5).indices
    # The same seeds draw the same tokens, whatever the other rows are.
    again, _ = sample_tokens(logits[2:], params[2:], [torch.Generator().manual_seed(i) for i in (2, 3)])
    assert again.tolist() == tokens[2:].tolist()


def test_sglang_backend_says_how_to_install_it(monkeypatch, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--backend", "sglang", "--port", "30001", "--sglang-arg=--tp-size=2"])
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(SGLangNotInstalled, match=r"pip install 'pqrl\[sglang\]'"):
        launch_sglang(EngineConfig(), ServeConfig(backend="sglang", port=30001))
    assert serve(args) == 2
    assert "SGLang is not installed" in capsys.readouterr().err

    cmd = sglang_command(
        model_path="/m", host="0.0.0.0", port=30001, weight_version="3", extra_args=["--tp-size=2"]
    )
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert cmd[cmd.index("--model-path") + 1] == "/m" and cmd[cmd.index("--weight-version") + 1] == "3"
    assert cmd[cmd.index("--port") + 1] == "30001" and cmd[-1] == "--tp-size=2"


def test_compute_modules_import_without_web_stack():
    code = (
        "import sys\n"
        "for name in ['fastapi', 'uvicorn', 'httpx', 'pydantic', 'starlette', 'redis', 'msgpack']:\n"
        "    sys.modules[name] = None\n"
        "import engine.batcher, engine.scheduler, engine.sampling_params, engine.config\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
