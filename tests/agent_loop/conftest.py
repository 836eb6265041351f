"""Fixtures for the built-in engine: the real SmolLM2-135M-Instruct, served over real loopback HTTP."""

from __future__ import annotations

from collections.abc import Iterator
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
