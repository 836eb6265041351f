"""Fixtures for the built-in engine: the real SmolLM2-135M-Instruct, served over real loopback HTTP."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from agent_loop.engine_batcher import BatchEngine
from agent_loop.engine_server import create_app
from pqrl.model_cache import load_model, load_tokenizer
from tests.agent_loop.servers import serve_in_thread


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
