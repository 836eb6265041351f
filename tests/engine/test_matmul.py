"""Linear layers that multiply in bfloat16 with float32 weights (``engine.matmul``): the product is
the bfloat16 one, a weight update reaches it, the real model keeps its parameters and tying, its
logits differ from float32 by rounding only, and the engine reports its own model's logprobs
before and after a weight update."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.batcher import BatchEngine, Sequence
from engine.matmul import BF16Linear, matmul_in_bfloat16
from engine.sampling_params import SamplingParams
from tests.models import chat_prompt, forced_logprobs


def _layer() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(64, 32)


def test_the_product_is_the_bfloat16_one_in_the_input_dtype():
    layer, x = _layer(), torch.randn(5, 64)
    assert matmul_in_bfloat16(layer) == 1 and type(layer) is BF16Linear
    want = torch.nn.functional.linear(x.bfloat16(), layer.weight.bfloat16(), layer.bias.bfloat16()).float()
    with torch.no_grad():
        got = layer(x)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert not torch.equal(got, x @ layer.weight.T + layer.bias), "bfloat16 rounding shows"


def test_a_weight_update_in_place_reaches_the_product():
    layer, x = _layer(), torch.randn(5, 64)
    matmul_in_bfloat16(layer)
    with torch.no_grad():
        before = layer(x)
        layer.weight.copy_(torch.randn_like(layer.weight))  # how the engine loads new weights
        layer.bias.zero_()
        after = layer(x)
    want = torch.nn.functional.linear(x.bfloat16(), layer.weight.bfloat16()).float()
    assert torch.equal(after, want) and not torch.equal(before, after)


@pytest.fixture(scope="module")
def halves(smollm):
    model, tok = smollm
    half = copy.deepcopy(model)
    n = matmul_in_bfloat16(half)
    return model, half, tok, n


def test_the_real_model_keeps_its_parameters_and_tying(halves):
    model, half, _, n = halves
    layers = model.config.num_hidden_layers
    assert n == 7 * layers + 1, "q, k, v, o, gate, up, down in every layer, and the head"
    assert half.state_dict().keys() == model.state_dict().keys()
    assert all(p.dtype == torch.float32 for p in half.parameters())
    assert half.lm_head.weight is half.model.embed_tokens.weight


def test_logits_differ_from_float32_by_bfloat16_rounding_only(halves):
    model, half, tok, _ = halves
    ids = torch.tensor([chat_prompt(tok, "What is 17 times 23? Use the calculator.")])
    with torch.inference_mode():
        full = model(ids).logits.float().log_softmax(-1)[0]
        ours = half(ids).logits.float().log_softmax(-1)[0]
    diff = (ours - full).abs().mean().item()
    agree = (ours.argmax(-1) == full.argmax(-1)).float().mean().item()
    print(f"mean |logprob difference| {diff:.4f}, greedy tokens agreeing {agree:.2f}")
    assert 0 < diff < 0.15 and agree > 0.9


def _sample(engine: BatchEngine, prompt: list[int], n: int = 4) -> list[Sequence]:
    params = SamplingParams(temperature=0.7, max_new_tokens=8, ignore_eos=True)
    rows = [Sequence(rid=f"r{i}", prompt_ids=prompt, params=params) for i in range(n)]
    engine.step(rows)
    while engine.rows:
        engine.step([])
    return rows


def _diffs(model: torch.nn.Module, prompt: list[int], rows: list[Sequence]) -> tuple[float, float]:
    """(mean, worst) |engine logprob - fresh forward's| over the rows' sampled tokens."""
    d = [
        abs(x - y)
        for r in rows
        for x, y in zip(forced_logprobs(model, prompt, r.output_ids, 0.7), r.logprobs, strict=True)
    ]
    return sum(d) / len(d), max(d)


def test_the_engine_reports_its_own_models_logprobs_across_a_weight_update(halves):
    """Within bfloat16's rounding: a product's rounding depends on the batch's shape, so a decode
    step and a fresh forward differ where float32 agrees to 1e-5: by 0.02-0.1 on average here, and
    by up to about 0.5 on the worst of 32 sampled tokens (a rare token's, whose logit is the farthest from
    the top ones). A weight update through the engine reaches the bfloat16 copies: against the old
    weights the same tokens score several nats apart on average."""
    model, half, tok, _ = halves
    served = copy.deepcopy(half)
    engine = BatchEngine(served, tok, seed=0)
    prompt = chat_prompt(tok, "Name a fruit.")
    mean, worst = _diffs(half, prompt, _sample(engine, prompt))
    assert mean < 0.15 and worst < 1.0, (mean, worst)
    new = {k: v * 0.5 for k, v in model.state_dict().items() if k.endswith("mlp.down_proj.weight")}
    engine.load_state(new)
    updated = copy.deepcopy(model)
    updated.load_state_dict(new, strict=False)
    matmul_in_bfloat16(updated)
    rows = _sample(engine, prompt)
    mean, worst = _diffs(updated, prompt, rows)
    assert mean < 0.15 and worst < 1.0, (mean, worst)
    stale_mean, _ = _diffs(half, prompt, rows)
    print(f"engine vs fresh forward: mean {mean:.3f}, worst {worst:.3f}; old weights: {stale_mean:.2f}")
    assert stale_mean > 2.0, f"the engine still multiplied by the old weights: {stale_mean}"
