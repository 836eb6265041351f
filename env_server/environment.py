"""``ToolEnvironment``: the base class users subclass to register a new tool environment.

Gymnasium-style and async::

    class Calc(ToolEnvironment):
        async def reset(self, *, task, seed=None):
            self.answer = task["answer"]
            return self.observation([Message(role="user", content=task["question"])])

        @tool
        async def calculator(self, expression: str) -> str:
            \"\"\"Evaluates an arithmetic expression.

            Args:
                expression: e.g. "3 * (4 + 5)".
            \"\"\"
            ...

        @tool(final=True)
        async def answer(self, value: str) -> str:
            \"\"\"Submits the final answer.\"\"\"
            self.submitted = value
            return "submitted"

        async def evaluate(self):
            return RewardResult(reward=float(self.submitted == self.answer))

``step`` is provided: it validates each call's arguments against the tool's signature and turns a
bad call (unknown tool, invalid arguments, an exception in the tool) into an error message the
model sees, with the call's ``ToolStatus`` (``invalid`` or ``error``), never an exception in the
server. Sandbox failures are the exception: they propagate
as ``SandboxError`` so the rollout records ``failed_infra``. Environments that set
``needs_sandbox = True`` get ``self.sandbox`` from the server's warm pool before ``reset``.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from pydantic import BaseModel

from env_server.tools import ToolSpec, collect_tools
from env_server.types import Message, Observation, RewardResult, StepResult, ToolCall, ToolStatus
from pqrl.text import clipped, encodable
from sandboxes.hardening import SandboxSettings
from sandboxes.protocol import Sandbox, SandboxError

__all__ = ["ToolEnvironment"]

_ERROR_CHARS = 1000  # of a failed call's exception, in its tool message


class ToolEnvironment:
    """Base class of tool environments. Subclasses implement ``reset``, tools and ``evaluate``.

    Class attributes:
        needs_sandbox: the server attaches a sandbox (``self.sandbox``) before ``reset``.
        sandbox_settings: settings of that sandbox (default: the hardened defaults).
        deterministic: ``reset`` with the same task and seed gives the same observation (checked
            by the conformance checker).
        task_model: the pydantic model of its tasks (a suite of its ``kind`` validates against it).
        config_model: the pydantic model of its keyword arguments (a suite's ``defaults``); when
            set, a construction with arguments it rejects raises ValueError, and the validated
            model is ``self.settings`` (what the environment reads: the same rules ``pqrl tasks
            validate`` applied, so a suite it accepts cannot fail at reset on its settings).
        reward_names: names of what ``evaluate`` scores (e.g. ``exact_match``), which a suite's
            ``reward`` may give instead of ``env``.
    """

    needs_sandbox: ClassVar[bool] = False
    sandbox_settings: ClassVar[SandboxSettings | None] = None
    deterministic: ClassVar[bool] = True
    tools: ClassVar[dict[str, ToolSpec]] = {}
    task_model: ClassVar[type[BaseModel] | None] = None
    config_model: ClassVar[type[BaseModel] | None] = None
    reward_names: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.tools = collect_tools(cls)

    def __init__(self, **config: Any) -> None:
        # a ValidationError is a ValueError; None without a config_model
        self.settings: Any = None if self.config_model is None else self.config_model.model_validate(config)
        self.config = config  # as given, for environments without a config_model
        self.sandbox: Sandbox | None = None
        self.done = False

    # ---------------------------------------------------------------- to implement

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        """Starts an episode for ``task``; returns the initial messages and the tools."""
        raise NotImplementedError

    async def evaluate(self) -> RewardResult:
        """Scores the episode (may be called before ``done``: it scores what exists)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Releases what the environment holds (the server releases the sandbox itself)."""

    @classmethod
    def sandbox_settings_for(cls, task: dict[str, Any]) -> SandboxSettings | None:
        """The sandbox ``task`` runs in (its own image, say); ``sandbox_settings`` unless overridden.
        Called before ``reset``; a task it rejects (ValueError) is a bad task."""
        return cls.sandbox_settings

    @classmethod
    def worked_example(cls, task: dict[str, Any]) -> list[ToolCall] | None:
        """The calls of a correct episode of ``task`` (one step each), for ``pqrl env check``; None
        when the environment gives none."""
        return None

    # ---------------------------------------------------------------- provided

    def observation(self, messages: list[Message]) -> Observation:
        """The initial observation with this environment's tool schemas."""
        return Observation(messages=messages, tools=self.tool_schemas())

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        return [spec.schema() for spec in cls.tools.values()]

    async def step(self, tool_calls: list[ToolCall]) -> StepResult:
        """Runs each call in order; one tool message per call, with its status. A final tool ends
        the episode, and calls after it are answered without running (``skipped``)."""
        messages: list[Message] = []
        for call in tool_calls:
            if self.done:
                content = f"Error: {call.name} was not run: the episode has ended"
                status = ToolStatus.SKIPPED
            else:
                content, status = await self.call_tool(call)
                spec = self.tools.get(call.name)
                if status is ToolStatus.OK and spec is not None and spec.final:
                    self.done = True
            messages.append(
                Message(role="tool", name=call.name, tool_call_id=call.id, content=content, status=status)
            )
        return StepResult(messages=messages, done=self.done, info={})

    async def call_tool(self, call: ToolCall) -> tuple[str, ToolStatus]:
        """(tool message content, how the call ended). Only sandbox failures raise."""
        spec = self.tools.get(call.name)
        if spec is None:
            available = ", ".join(self.tools)
            return (
                f"Error: unknown tool {clipped(repr(call.name), _ERROR_CHARS)}; available tools: {available}",
                ToolStatus.INVALID,
            )
        try:
            kwargs = spec.validate(call.arguments)
        except ValueError as e:
            return f"Error: {clipped(str(e), _ERROR_CHARS)}", ToolStatus.INVALID
        try:
            # Through the class: a tool may share its name with an attribute (e.g. ``done``).
            result = await getattr(type(self), spec.method_name)(self, **kwargs)
        except (SandboxError, asyncio.CancelledError):
            raise
        except Exception as e:  # the model's call failed, not the server
            return (
                f"Error: {call.name} failed: {type(e).__name__}: {clipped(str(e), _ERROR_CHARS)}",
                ToolStatus.ERROR,
            )
        return encodable("" if result is None else str(result)), ToolStatus.OK
