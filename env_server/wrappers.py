"""Cross-cutting limits as wrappers, so no environment has to implement them itself."""

from __future__ import annotations

import asyncio
from typing import Any

from env_server.environment import ToolEnvironment
from env_server.types import Message, Observation, RewardResult, StepResult, ToolCall, ToolStatus
from pqrl.finite import finite

__all__ = ["ObservationCap", "ToolTimeout", "TurnLimit", "Wrapper"]


class Wrapper:
    """Delegates everything to the wrapped environment; subclasses override what they limit."""

    def __init__(self, env: ToolEnvironment | Wrapper) -> None:
        self.env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    @property
    def unwrapped(self) -> ToolEnvironment:
        env = self.env
        return env.unwrapped if isinstance(env, Wrapper) else env

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        return await self.env.reset(task=task, seed=seed)

    async def step(self, tool_calls: list[ToolCall]) -> StepResult:
        return await self.env.step(tool_calls)

    async def evaluate(self) -> RewardResult:
        return await self.env.evaluate()

    async def close(self) -> None:
        await self.env.close()


class TurnLimit(Wrapper):
    """Ends the episode after ``max_turns`` steps (``info["truncated"] = "turn_limit"``)."""

    def __init__(self, env: ToolEnvironment | Wrapper, max_turns: int) -> None:
        super().__init__(env)
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        self.max_turns = max_turns
        self.turns = 0

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.turns = 0
        return await self.env.reset(task=task, seed=seed)

    async def step(self, tool_calls: list[ToolCall]) -> StepResult:
        result = await self.env.step(tool_calls)
        self.turns += 1
        if self.turns >= self.max_turns and not result.done:
            result = result.model_copy(
                update={"done": True, "info": {**result.info, "truncated": "turn_limit"}}
            )
            self.unwrapped.done = True
        return result


class ToolTimeout(Wrapper):
    """Gives each tool call at most ``seconds``; a slow call becomes an error message with status
    ``timeout``."""

    def __init__(self, env: ToolEnvironment | Wrapper, seconds: float) -> None:
        super().__init__(env)
        if finite(seconds, "seconds") <= 0:  # a NaN would pass "<= 0" and never time out
            raise ValueError("seconds must be > 0")
        self.seconds = seconds

    async def step(self, tool_calls: list[ToolCall]) -> StepResult:
        messages: list[Message] = []
        info: dict[str, Any] = {}
        done = False
        for call in tool_calls:  # one call at a time, so each gets its own deadline
            if done:
                content = f"Error: {call.name} was not run: the episode has ended"
                messages.append(_tool_message(call, content, ToolStatus.SKIPPED))
                continue
            try:
                part = await asyncio.wait_for(self.env.step([call]), self.seconds)
            except TimeoutError:
                content = f"Error: {call.name} timed out after {self.seconds:g}s"
                part = StepResult(messages=[_tool_message(call, content, ToolStatus.TIMEOUT)])
            messages += part.messages
            info.update(part.info)
            done = done or part.done
        return StepResult(messages=messages, done=done, info=info)


def _tool_message(call: ToolCall, content: str, status: ToolStatus) -> Message:
    return Message(role="tool", name=call.name, tool_call_id=call.id, content=content, status=status)


class ObservationCap(Wrapper):
    """Cuts any message longer than ``max_chars``, telling the model how much was left out."""

    def __init__(self, env: ToolEnvironment | Wrapper, max_chars: int) -> None:
        super().__init__(env)
        if max_chars < 64:
            raise ValueError("max_chars must be >= 64")
        self.max_chars = max_chars

    def _cap(self, m: Message) -> Message:
        if len(m.content) <= self.max_chars:
            return m
        cut = len(m.content) - self.max_chars
        return m.model_copy(
            update={"content": m.content[: self.max_chars] + f"\n[output truncated: {cut} more characters]"}
        )

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        obs = await self.env.reset(task=task, seed=seed)
        return obs.model_copy(update={"messages": [self._cap(m) for m in obs.messages]})

    async def step(self, tool_calls: list[ToolCall]) -> StepResult:
        result = await self.env.step(tool_calls)
        return result.model_copy(update={"messages": [self._cap(m) for m in result.messages]})
