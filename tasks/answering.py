"""The ``answer`` tool of environments graded by one exact number (calc, data), and their grading."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from env_server import RewardResult, ToolCall, ToolEnvironment, tool
from tasks.graders import exact_number_match, shaped_reward

__all__ = ["NumberAnswerConfig", "NumberAnswerEnv"]


class NumberAnswerConfig(BaseModel):
    """The keyword arguments of calc-v1 and data-v1 (a suite's ``defaults``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    shots: int = Field(1, ge=0, le=2, description="worked examples rendered into the prompt")
    level: Literal[1, 2] = Field(2, description="which worked examples come first")
    format_reward: float = Field(0.0, ge=0, lt=1, description="credit for a grounded miss")


class NumberAnswerEnv(ToolEnvironment):
    """A subclass sets ``expected`` at reset and calls ``grade`` from ``evaluate`` with what its
    tools saw: whether they were used on the task and the numbers they returned. Config:
    ``format_reward`` (default 0, see ``tasks.graders.shaped_reward``)."""

    config_model = NumberAnswerConfig
    settings: NumberAnswerConfig
    reward_names = ("exact_match",)
    # the task's gold-solution field, the tool that runs it, and that tool's argument
    solution: ClassVar[tuple[str, str, str]]
    expected: str
    submitted: str | None = None

    @classmethod
    def worked_example(cls, task: dict[str, Any]) -> list[ToolCall] | None:
        """The gold solution run with its tool, then its answer submitted."""
        field, tool_name, argument = cls.solution
        gold = task.get(field)
        if not isinstance(gold, str):
            return None
        return [ToolCall(name=tool_name, arguments={argument: gold}, id="w1"),
                ToolCall(name="answer", arguments={"value": str(task["answer"])}, id="w2")]  # fmt: skip

    @tool(final=True)
    async def answer(self, value: str) -> str:
        """Submits the final answer (a number) and ends the task.

        Args:
            value: the final number.
        """
        self.submitted = str(value)
        return "submitted"

    def grade(self, *, used: bool, results: list[str], **info: Any) -> RewardResult:
        score = exact_number_match(self.submitted, self.expected)
        grounded = any(exact_number_match(self.submitted, r) for r in results)
        return RewardResult(
            reward=shaped_reward(score, self.settings.format_reward, used=used, grounded=grounded),
            info={"submitted": self.submitted, "expected": self.expected, "grounded": grounded, **info},
        )
