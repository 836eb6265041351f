"""``Engine``: what the agent loop needs from an inference engine, and nothing more.

``engine.client.EngineClient`` implements it over HTTP (the built-in engine or SGLang); stand-ins
(the scripted expert of ``agent_loop.demonstrations``, benchmark simulators) implement it directly.
Weight updates and server control are the trainer's business and stay on ``EngineClient``.

This module is the agent loop's one way into the engine package, so it also names the data types
the interface speaks in: ``SamplingParams`` in, ``Generation`` (with its ``FinishReason``) out,
``EngineError`` raised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from engine.errors import EngineError
from engine.sampling_params import SamplingParams
from engine.types import FinishReason, Generation

__all__ = ["CatchesUpFromDisk", "Engine", "EngineError", "FinishReason", "Generation", "SamplingParams"]


@runtime_checkable
class Engine(Protocol):
    """Generates from exact token lists, keeping a rollout's calls together where it can."""

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        *,
        rollout_id: str | None = None,
    ) -> Generation:
        """Generates until a stop, the token budget or an abort, with a logprob and a weight version
        per output token.

        Args:
            input_ids: the prompt tokens (never re-tokenized).
            sampling_params: ``SamplingParams()`` when None.
            rollout_id: calls with the same id belong to one rollout (an engine may keep its prefix).

        Raises:
            EngineError: the engine could not produce the generation.
        """
        ...

    def release(self, rollout_id: str) -> None:
        """The rollout is over: state kept for it (its server, its prefix) may go."""
        ...


@runtime_checkable
class CatchesUpFromDisk(Protocol):
    """An engine that can load a run's published weights on those of its servers that serve an older
    version (``EngineClient``): a server restarted mid-run comes back with its base weights."""

    async def catch_up_from_disk(self, model_path: str, version: int) -> list[str]:
        """Loads ``model_path`` as ``version`` where a server is behind; returns their URLs."""
        ...
