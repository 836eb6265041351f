"""Fixtures of the job tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def long_tiny_model(tmp_path_factory) -> Path:
    """The tiny model with room for a whole calc prompt."""
    from pqrl.model_cache import load_tokenizer
    from tests.models import tiny_llama

    tok = load_tokenizer()
    path = tmp_path_factory.mktemp("tiny-long")
    tiny_llama(len(tok), positions=2048).save_pretrained(path)
    tok.save_pretrained(path)
    return path
