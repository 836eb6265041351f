"""Fixtures: SmolLM2's real tokenizer (loaded once) and renderers over its template and test ones."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from loss_masking import ChatRenderer
from pqrl.model_cache import load_tokenizer
from tests.loss_masking.templates import HERMES


@pytest.fixture(scope="session")
def tok() -> Any:
    return load_tokenizer()


@pytest.fixture(scope="session")
def with_template(tok) -> Callable[[str], Any]:
    """A copy of the SmolLM2 tokenizer carrying another chat template."""

    def make(template: str) -> Any:
        t = copy.deepcopy(tok)
        t.chat_template = template
        return t

    return make


@pytest.fixture(scope="session")
def smollm(tok) -> ChatRenderer:
    return ChatRenderer(tok)


@pytest.fixture(scope="session")
def hermes(with_template) -> ChatRenderer:
    return ChatRenderer(with_template(HERMES))


@pytest.fixture(params=["smollm", "hermes"])
def renderer(request) -> ChatRenderer:
    return request.getfixturevalue(request.param)
