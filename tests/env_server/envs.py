"""Test-only environments, registered on import (tests/env_server/conftest.py imports this module).

Well-behaved ones are registered here and pass the conformance checker like the built-ins; the
deliberately broken ones (``Broken*``) are only registered inside the tests that need them.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, ClassVar

from env_server.environment import ToolEnvironment
from env_server.registry import register_environment
from env_server.tools import tool
from env_server.types import Message, Observation, RewardResult, ToolCall, ToolStatus

SLOW_TIMEOUT_S = 0.2  # ToolTimeout of pytest-slow-v1
LONG_CAP = 100  # ObservationCap of pytest-long-v1
COUNTER_TURNS = 3  # TurnLimit of pytest-counter-v1


class SlowEnv(ToolEnvironment):
    """A tool that sleeps (for ToolTimeout) next to a quick one, and a final tool without args."""

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.finished = False
        return self.observation([Message(role="user", content="Take your time.")])

    @tool
    async def nap(self, seconds: float) -> str:
        """Sleeps, then says so.

        Args:
            seconds: how long to sleep.
        """
        await asyncio.sleep(seconds)
        return f"slept {seconds:g}s"

    @tool
    async def quick(self) -> str:
        """Answers at once."""
        return "quick"

    @tool(final=True)
    async def finish(self) -> str:
        """Ends the episode."""
        self.finished = True
        return "finished"

    async def evaluate(self) -> RewardResult:
        return RewardResult(reward=float(self.finished))


class LongEnv(ToolEnvironment):
    """A tool with arbitrarily long output (for ObservationCap)."""

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        return self.observation([Message(role="user", content=str(task.get("prompt", "Shout.")))])

    @tool
    async def shout(self, n: int) -> str:
        """Returns ``n`` times the letter x.

        Args:
            n: how many.
        """
        return "x" * n

    @tool(final=True)
    async def finish(self) -> str:
        """Ends the episode."""
        return "ok"

    async def evaluate(self) -> RewardResult:
        return RewardResult(reward=0.0)


class CounterEnv(ToolEnvironment):
    """Counts ``incr`` calls, so a test can see how often a step was applied. Takes exactly one
    config value, ``start``, so unknown ``env_kwargs`` are a TypeError."""

    def __init__(self, start: int = 0) -> None:
        super().__init__(start=start)
        self.start = start

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.count = self.start
        return self.observation([Message(role="user", content="Count.")])

    @tool
    async def incr(self) -> str:
        """Adds one to the counter and returns the new value."""
        self.count += 1
        return str(self.count)

    @tool(final=True)
    async def stop(self) -> str:
        """Ends the episode."""
        return "stopped"

    async def evaluate(self) -> RewardResult:
        return RewardResult(reward=float(self.count), info={"count": self.count})


class StrictTaskEnv(ToolEnvironment):
    """Rejects tasks without a string ``answer`` (KeyError / ValueError from reset)."""

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        answer = task["answer"]  # KeyError: the server answers 422
        if not isinstance(answer, str):
            raise ValueError(f"answer must be a string, got {type(answer).__name__}")
        self.answer, self.given = answer, None
        return self.observation([Message(role="user", content="Guess.")])

    @tool(final=True)
    async def guess(self, value: str) -> str:
        """Submits a guess.

        Args:
            value: the guess.
        """
        self.given = value
        return "noted"

    async def evaluate(self) -> RewardResult:
        return RewardResult(reward=float(self.given == self.answer))


# ---------------------------------------------------------------- broken on purpose


class BrokenAcceptsAnything(CounterEnv):
    """Answers every call, even an unknown tool or invalid arguments, without an error."""

    async def call_tool(self, call: ToolCall) -> tuple[str, ToolStatus]:
        return "fine", ToolStatus.OK


class BrokenNondeterministic(CounterEnv):
    """Claims to be deterministic, but its first message changes on every reset."""

    _draws = itertools.count()

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.count = 0
        return self.observation([Message(role="user", content=f"Count from {next(self._draws)}.")])


class BrokenDuplicateSchemas(CounterEnv):
    """Describes ``incr`` twice to the model."""

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        schemas = super().tool_schemas()
        return schemas + schemas[:1]


class BrokenNeverEnds(CounterEnv):
    """Its final tool does not end the episode."""

    async def step(self, tool_calls: list[ToolCall]) -> Any:
        result = await super().step(tool_calls)
        self.done = False
        return result.model_copy(update={"done": False})


class BrokenSilentReset(CounterEnv):
    """Starts episodes without any message."""

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.count = 0
        return self.observation([])


class BrokenGrader(CounterEnv):
    """Its grader fails on some counts (``start`` sets the count without a step): at 0 it raises,
    at 1 it gives a NaN reward, at 2 info that is not JSON; otherwise it scores the count. Every
    call is recorded in ``evaluations``."""

    evaluations: ClassVar[list[int]] = []

    async def evaluate(self) -> RewardResult:
        self.evaluations.append(self.count)
        if self.count == 0:
            raise RuntimeError("grader bug: nothing to count")
        if self.count == 1:
            return RewardResult(reward=float("nan"))
        if self.count == 2:
            return RewardResult(reward=2.0, info={"handle": object()})
        return await super().evaluate()


class BrokenStep(CounterEnv):
    """Its step raises: a bug the server answers with its error body, never a bare 500."""

    async def step(self, tool_calls: list[ToolCall]) -> Any:
        raise RuntimeError("step bug")


class SandboxCrashOnReset(ToolEnvironment):
    """Needs a sandbox, then fails in reset with an error that is not a task rejection."""

    needs_sandbox = True

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        raise RuntimeError("reset crashed")

    @tool(final=True)
    async def submit(self) -> str:
        """Ends the episode."""
        return "submitted"

    async def evaluate(self) -> RewardResult:
        return RewardResult(reward=0.0)


class BrokenNonFinite(ToolEnvironment):
    """Puts a number that is not finite where ``task["where"]`` says: its first observation's tool
    schemas (``reset``), a step's info (``step``), the grader's info (``evaluate``) or the reward,
    set after the RewardResult was validated (``reward``)."""

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.where = task.get("where")
        observation = self.observation([Message(role="user", content="Measure.")])
        if self.where == "reset":
            observation.tools[0]["function"]["x-weight"] = float("inf")
        return observation

    @tool
    async def measure(self) -> str:
        """Measures."""
        return "measured"

    async def step(self, tool_calls: list[ToolCall]) -> Any:
        result = await super().step(tool_calls)
        if self.where == "step":
            result.info["metrics"] = {"loss": [0.5, float("nan")]}
        return result

    async def evaluate(self) -> RewardResult:
        result = RewardResult(reward=0.5)
        if self.where == "reward":
            result.reward = float("nan")
        elif self.where == "evaluate":
            result.info["verifier"] = {"score": float("-inf")}
        return result


class BrokenInfiniteDefault(BrokenNonFinite):
    """A tool whose default is infinite: its schema cannot be sent as JSON."""

    @tool
    async def wait(self, seconds: float = float("inf")) -> str:
        """Waits."""
        return "waited"


class BadSetupOnReset(ToolEnvironment):
    """Its reset's setup runs a sandbox call that fails (an upload of an archive that is not one,
    to ``task["dest"]``): the sandbox is alive, the environment's own setup is wrong. Counts its
    resets."""

    needs_sandbox = True
    resets: ClassVar[int] = 0

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        BadSetupOnReset.resets += 1
        assert self.sandbox is not None
        await self.sandbox.upload(b"not a tar archive" * 1000, task.get("dest", "/workspace"))
        return self.observation([])

    @tool(final=True)
    async def submit(self) -> str:
        """Ends the episode."""
        return "submitted"

    async def evaluate(self) -> RewardResult:
        return RewardResult(reward=0.0)


def register() -> None:
    here = __name__
    register_environment("pytest-slow-v1", f"{here}:SlowEnv", tool_timeout_s=SLOW_TIMEOUT_S)
    register_environment("pytest-long-v1", f"{here}:LongEnv", max_observation_chars=LONG_CAP)
    register_environment("pytest-counter-v1", f"{here}:CounterEnv", max_turns=COUNTER_TURNS)
    register_environment(
        "pytest-strict-task-v1", f"{here}:StrictTaskEnv", sample_task={"answer": "yes"}, max_turns=4
    )


register()


class BrokenCorrectEarnsNothing(StrictTaskEnv):
    """Its worked example submits the right answer, but its grader scores every episode 0."""

    @classmethod
    def worked_example(cls, task: dict[str, Any]) -> list[ToolCall] | None:
        return [ToolCall(name="guess", arguments={"value": task["answer"]}, id="w1")]

    async def evaluate(self) -> RewardResult:
        return RewardResult(reward=0.0)


class BrokenGenerous(BrokenCorrectEarnsNothing):
    """Scores every episode 1, one without any call too."""

    async def evaluate(self) -> RewardResult:
        return RewardResult(reward=1.0)
