"""Built-in environments: ``echo-v1`` (no sandbox; tests, benchmarks, the smallest example) and
``shell-v1`` (a sandboxed shell with file tools; the base of coding tasks)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from env_server.environment import ToolEnvironment
from env_server.registry import register_environment
from env_server.tools import tool
from env_server.types import Message, Observation, RewardResult
from pqrl.finite import bounded

__all__ = ["EchoEnv", "EchoTask", "ShellEnv", "ShellTask", "register"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EchoTask(_Strict):
    kind: Literal["echo"] = "echo"
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    prompt: str = "Say something."
    expected: str = ""


class ShellTask(_Strict):
    kind: Literal["shell"] = "shell"
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    prompt: str = ""
    setup: list[str] = Field(default_factory=list, description="commands run in the sandbox first")
    check: str = Field(min_length=1, description="the command whose exit status 0 earns reward 1")


class NoConfig(_Strict):
    """An environment that takes no keyword arguments."""


class EchoEnv(ToolEnvironment):
    """Task ``{"prompt": str, "expected": str}``: reward 1 when the submitted answer is ``expected``."""

    task_model = EchoTask

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.expected = str(task.get("expected", ""))
        self.answer: str | None = None
        return self.observation([Message(role="user", content=str(task.get("prompt", "Say something.")))])

    @tool
    async def echo(self, text: str) -> str:
        """Returns its input unchanged.

        Args:
            text: what to echo.
        """
        return text

    @tool(final=True)
    async def submit(self, answer: str) -> str:
        """Submits the final answer and ends the episode.

        Args:
            answer: the answer.
        """
        self.answer = answer
        return "submitted"

    async def evaluate(self) -> RewardResult:
        return RewardResult(reward=float(self.answer == self.expected), info={"answer": self.answer})


class ShellEnv(ToolEnvironment):
    """A sandboxed shell. Task ``{"prompt": str, "setup": [cmd, ...], "check": cmd}``; the reward
    is 1 when ``check`` exits 0 in the sandbox after the episode."""

    needs_sandbox = True
    task_model = ShellTask
    config_model = NoConfig

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.check = task.get("check")
        for cmd in task.get("setup", []):
            result = await self.sandbox.exec(cmd, timeout=120)
            if not result.ok:
                raise ValueError(f"task setup command {cmd!r} failed: {result.text()[-500:]}")
        return self.observation([Message(role="user", content=str(task.get("prompt", "")))])

    @tool
    async def run(self, command: str, timeout: float = 30.0) -> str:
        """Runs a shell command in /workspace and returns its exit code and output.

        Args:
            command: the command line, run by /bin/sh.
            timeout: seconds before the command is killed (at most 300).
        """
        seconds = bounded(timeout, 0.1, 300.0, "timeout")
        result = await self.sandbox.exec(command, timeout=seconds, cwd="/workspace")
        status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        cut = " (output truncated)" if result.truncated else ""
        return f"[{status}{cut}]\n{result.text()}"

    @tool
    async def read_file(self, path: str) -> str:
        """Returns the text of a file.

        Args:
            path: absolute, or relative to /workspace.
        """
        return (await self.sandbox.read_file(_abs(path), max_bytes=1 << 20)).decode("utf-8", "replace")

    @tool
    async def write_file(self, path: str, content: str) -> str:
        """Creates or overwrites a file with the given text.

        Args:
            path: absolute, or relative to /workspace.
            content: the full new content.
        """
        await self.sandbox.write_file(_abs(path), content.encode())
        return f"wrote {len(content)} characters to {_abs(path)}"

    @tool(final=True)
    async def submit(self) -> str:
        """Ends the episode; the work in /workspace is graded."""
        return "submitted"

    async def evaluate(self) -> RewardResult:
        if not self.check:
            return RewardResult(reward=0.0, info={"reason": "task has no check command"})
        result = await self.sandbox.exec(self.check, timeout=300, cwd="/workspace")
        return RewardResult(reward=float(result.ok), info={"exit_code": result.exit_code,
                                                           "output": result.text()[-2000:]})  # fmt: skip


def _abs(path: str) -> str:
    return path if path.startswith("/") else "/workspace/" + path


def register() -> None:
    register_environment(
        "echo-v1",
        entry_point="env_server.builtin:EchoEnv",
        max_turns=8,
        sample_task={"prompt": "Submit 42.", "expected": "42"},
        example_calls=[{"name": "submit", "arguments": {"answer": "42"}}],
    )
    register_environment(
        "shell-v1",
        entry_point="env_server.builtin:ShellEnv",
        max_turns=16,
        sample_task={
            "prompt": "Create hello.txt.",
            "setup": ["mkdir -p /workspace/src"],
            "check": "test -f hello.txt",
        },
        example_calls=[
            {"name": "write_file", "arguments": {"path": "hello.txt", "content": "hi"}},
            {"name": "submit", "arguments": {}},
        ],
    )
