"""The chunked log-softmax/gather equals the plain full-logits computation: values and gradients."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.trainer.one_thread import one_torch_thread  # noqa: F401 (autouse: torch on one thread)
from trainer.logprobs import full_logprobs, fused_logprobs, has_plain_head, head_logprobs


def _inputs(n=37, h=16, v=300, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g, dtype=dtype) * 2).requires_grad_()
    weight = torch.randn(v, h, generator=g, dtype=dtype).requires_grad_()
    target = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, target


def _grads(fn, hidden, weight, target, coef_logp, coef_ent):
    logp, ent = fn(hidden, weight, target)
    (logp * coef_logp + ent * coef_ent).sum().backward()
    out = (logp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    return out


@pytest.mark.parametrize("chunk", [1, 8, 37, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_matches_full_logits_values_and_gradients(chunk, temperature, dtype):
    """float64: the formulas are exact; float32: the chunked sums stay as accurate as the plain ones."""
    hidden, weight, target = _inputs(dtype=dtype)
    g = torch.Generator().manual_seed(1)
    coef_logp, coef_ent = torch.randn(37, generator=g, dtype=dtype), torch.randn(37, generator=g, dtype=dtype)

    def full(h, w, t):
        return full_logprobs(h @ w.T, t, temperature)

    def fused(h, w, t):
        return fused_logprobs(h, w, t, temperature=temperature, chunk_tokens=chunk, with_entropy=True)

    expected = _grads(full, hidden, weight, target, coef_logp, coef_ent)
    got = _grads(fused, hidden, weight, target, coef_logp, coef_ent)
    assert expected[2].abs().max() > 0 and expected[3].abs().max() > 0
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    for name, a, b in zip(("logp", "entropy", "d hidden", "d weight"), got, expected, strict=True):
        err = float((a.double() - b.double()).abs().max() / b.abs().max())
        assert err < tol, f"{name}: max error {err:.2e} of the largest value"


def test_without_entropy_only_logp_carries_gradient():
    hidden, weight, target = _inputs()
    logp, ent = fused_logprobs(hidden, weight, target, chunk_tokens=5)
    assert torch.equal(ent, torch.zeros_like(ent)) and not ent.requires_grad
    logp.sum().backward()
    ref_h, ref_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    full_logprobs(hidden @ weight.T, target)[0].sum().backward()
    assert torch.allclose(ref_h, hidden.grad, atol=1e-5) and torch.allclose(ref_w, weight.grad, atol=1e-5)


def test_autocast_multiplies_in_the_autocast_dtype_like_the_head_would():
    hidden, weight, target = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = fused_logprobs(hidden, weight, target, chunk_tokens=8)
        expected, _ = full_logprobs(hidden @ weight.T, target)  # bf16 matmul, float32 softmax
    assert logp.dtype == torch.float32
    assert torch.allclose(logp, expected, atol=1e-3)
    exact, _ = full_logprobs(hidden.float() @ weight.float().T, target)
    assert not torch.allclose(logp, exact, atol=1e-4)  # the bf16 matmul really happened


def test_head_logprobs_through_a_model_equal_its_logits():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=211, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, tie_word_embeddings=True)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    assert has_plain_head(model)
    ids = torch.randint(0, 211, (1, 20))
    hidden = model.model(input_ids=ids).last_hidden_state[0, :-1]
    logp, ent = head_logprobs(model, hidden, ids[0, 1:], temperature=1.0, chunk_tokens=6, with_entropy=True)
    expected = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    assert torch.allclose(logp, expected, atol=1e-5)
    logp.sum().backward()  # through the tied embedding
    assert model.model.embed_tokens.weight.grad.abs().max() > 0
