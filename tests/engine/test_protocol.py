"""The HTTP client and the scripted expert both satisfy ``engine.protocol.Engine``, the interface the
agent loop calls: same methods, async where the protocol's are, every parameter accepted by name."""

from __future__ import annotations

import inspect

import pytest

from agent_loop.demonstrations import ExpertEngine
from engine.client import EngineClient
from engine.protocol import Engine

IMPLEMENTATIONS = [EngineClient, ExpertEngine]


def _protocol_methods() -> list[str]:
    return [n for n, v in vars(Engine).items() if inspect.isfunction(v) and not n.startswith("_")]


def test_the_protocol_is_small():
    assert sorted(_protocol_methods()) == ["generate", "release"]


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_implementation_satisfies_the_protocol(cls):
    assert issubclass(cls, Engine)
    for name in _protocol_methods():
        want, have = getattr(Engine, name), getattr(cls, name)
        assert have is not want, f"{cls.__name__}.{name} is the protocol's stub"
        assert inspect.iscoroutinefunction(have) == inspect.iscoroutinefunction(want), name
        wanted = inspect.signature(want).parameters
        given = inspect.signature(have).parameters
        for param in wanted.values():
            assert param.name in given, f"{cls.__name__}.{name} lacks parameter {param.name}"
            assert given[param.name].kind == param.kind, f"{cls.__name__}.{name}({param.name}): kind"
            if param.default is not inspect.Parameter.empty:
                assert given[param.name].default == param.default, f"{cls.__name__}.{name}({param.name})"
        extra = [p for n, p in given.items() if n not in wanted]
        assert all(p.default is not inspect.Parameter.empty for p in extra), f"{cls.__name__}.{name}"


def test_an_object_without_release_is_not_an_engine():
    class GenerateOnly:
        async def generate(self, input_ids, sampling_params=None, *, rollout_id=None): ...

    assert not isinstance(GenerateOnly(), Engine)
