"""Model fixtures shared by every package's tests: the real SmolLM2-135M-Instruct (and its engine served
over real loopback HTTP), and a tiny random-init Llama with SmolLM2's tokenizer for fast training."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.batcher import BatchEngine
from engine.http_app import create_app
from pqrl.model_cache import load_model, load_tokenizer
from tests.servers import serve_in_thread


@pytest.fixture(scope="session")
def smollm() -> tuple[Any, Any]:
    """The model (float32, never modified: the reference for version-0 weights) and its tokenizer."""
    return load_model(dtype=torch.float32).eval(), load_tokenizer()


@pytest.fixture(scope="module")
def served(smollm) -> Iterator[tuple[str, BatchEngine]]:
    """A built-in engine server on the shared model; tests here must not change its weights."""
    model, tok = smollm
    engine = BatchEngine(model, tok, seed=0)
    with serve_in_thread(create_app(engine, model_path="smollm2")) as url:
        yield url, engine


def chat_prompt(tokenizer: Any, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def forced_logprobs(
    model: Any, prompt: list[int], output: list[int], temperature: float = 1.0
) -> list[float]:
    """Teacher-forced log_softmax(logits / T) of ``output`` after ``prompt``: one fresh forward pass."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


def trajectory_logprobs(model: Any, tokens: np.ndarray, temperature: float) -> np.ndarray:
    """Teacher-forced log_softmax(logits / T) of every token of a whole record (0 at position 0)."""
    with torch.inference_mode():
        logits = model(torch.tensor(tokens[None, :], dtype=torch.long)).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    out = np.zeros(len(tokens), np.float32)
    out[1:] = logp[:-1].gather(1, torch.tensor(tokens[1:], dtype=torch.long)[:, None])[:, 0].numpy()
    return out


def mask_runs(mask: np.ndarray) -> int:
    """How many separate runs of 1s ``mask`` holds (one per assistant turn in a loss mask)."""
    padded = np.concatenate([[0], mask.astype(np.int8), [0]])
    return int(np.sum(np.diff(padded) == 1))


def max_abs_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


@pytest.fixture(scope="module")
def updatable(smollm, tmp_path_factory) -> Iterator[tuple[str, BatchEngine, Path, Any]]:
    """A server on its own copy of the model, and a checkpoint of perturbed weights on disk."""
    base, tok = smollm
    new = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            if p.ndim == 2:  # small noise: a different but still fluent policy
                p.add_(torch.randn(p.shape, generator=gen) * 0.05 * p.std())
    path = tmp_path_factory.mktemp("weights") / "step1"
    new.save_pretrained(path)
    engine = BatchEngine(copy.deepcopy(base), tok)
    with serve_in_thread(create_app(engine)) as url:
        yield url, engine, path, new


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
