"""A pqrl plug-in with its own task kind, ``convert``: turn a length into another unit."""

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from env_server import Message, RewardResult, ToolEnvironment, register_environment, tool

METRES = {"m": 1.0, "km": 1000.0, "cm": 0.01, "mi": 1609.344, "ft": 0.3048, "in": 0.0254}
Unit = Literal["m", "km", "cm", "mi", "ft", "in"]
SYSTEM = (
    "Units: m, km, cm, mi, ft, in. Get the factor with the factor tool, then submit the value times the "
    "factor."
)


class ConvertTask(BaseModel):  # a suite of kind "convert" validates against this
    model_config = ConfigDict(extra="forbid")
    kind: Literal["convert"] = "convert"
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    value: float
    source: Unit
    target: Unit
    answer: float


class ConvertConfig(BaseModel):  # the suite's "defaults"
    model_config = ConfigDict(extra="forbid")
    tolerance: float = Field(1e-3, gt=0, lt=1)


class ConvertEnv(ToolEnvironment):
    task_model, config_model = ConvertTask, ConvertConfig

    async def reset(self, *, task, seed=None):
        self.task, self.submitted = ConvertTask.model_validate(task), None
        shown = [("Convert 2 km to m.", "km", "m", "1000", "2000")]  # a worked example
        msgs = [Message(role="system", content=SYSTEM)]
        for q, a, b, f, v in shown:
            msgs += [Message(role="user", content=q),
                     Message.calling("factor", source=a, target=b),
                     Message(role="tool", name="factor", content=f),
                     Message.calling("submit", value=v),
                     Message(role="tool", name="submit", content="submitted")]  # fmt: skip
        t = self.task
        return self.observation(
            [*msgs, Message(role="user", content=f"Convert {t.value:g} {t.source} to {t.target}.")]
        )

    @tool
    async def factor(self, source: Unit, target: Unit) -> str:
        """How many of the target unit make one source unit.

        Args:
            source: the unit converted from.
            target: the unit converted to.
        """
        return f"{METRES[source] / METRES[target]:.6g}"

    @tool(final=True)
    async def submit(self, value: float) -> str:
        """Submits the converted number; ends the episode.

        Args:
            value: the quantity in the target unit.
        """
        self.submitted = value
        return "submitted"

    async def evaluate(self):
        ok = self.submitted is not None and math.isclose(
            self.submitted, self.task.answer, rel_tol=self.settings.tolerance
        )
        return RewardResult(reward=float(ok), info={"submitted": self.submitted})


def register():
    register_environment(
        "convert-v1", entry_point="pqrl_convert_env:ConvertEnv", max_turns=3,
        sample_task={"id": "c-0", "value": 3, "source": "km", "target": "m", "answer": 3000},
        example_calls=[{"name": "factor", "arguments": {"source": "km", "target": "m"}},
                       {"name": "submit", "arguments": {"value": 3000}}],
    )  # fmt: skip
