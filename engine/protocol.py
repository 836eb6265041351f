"""``Engine``: what the agent loop needs from an inference engine, and nothing more.

``engine.client.EngineClient`` implements it over HTTP (the built-in engine or SGLang); stand-ins
(the scripted expert of ``agent_loop.demonstrations``, benchmark simulators) implement it directly.
Weight updates and server control are the trainer's business and stay on ``EngineClient``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from engine.types import Generation, SamplingParams

__all__ = ["Engine"]


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
            engine.errors.EngineError: the engine could not produce the generation.
        """
        ...

    def release(self, rollout_id: str) -> None:
        """The rollout is over: state kept for it (its server, its prefix) may go."""
        ...
