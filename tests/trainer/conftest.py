"""Fixtures of the trainer tests that run real training jobs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def tiny_llama(vocab_size: int, hidden_size: int = 32, layers: int = 2, heads: int = 4, positions: int = 256):
    """A random-init Llama (seed 0) small enough to train in seconds on a CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(heads // 2, 1),
        max_position_embeddings=positions,
    )  # fmt: skip
    return LlamaForCausalLM(cfg)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random-init Llama with SmolLM2's tokenizer (real vocabulary, fast to train on CPU)."""
    from pqrl.model_cache import load_tokenizer

    tok = load_tokenizer()
    path = tmp_path_factory.mktemp("tiny")
    tiny_llama(len(tok)).save_pretrained(path)
    tok.save_pretrained(path)
    return path
