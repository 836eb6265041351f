"""A Harbor task: an instruction, a sandbox image built from its ``environment/``, a verifier.

Harbor lays a task out as a directory: ``instruction.md``, ``task.toml`` (``[agent]`` and
``[verifier]`` ``timeout_sec``), ``environment/Dockerfile``, ``tests/test.sh`` (the verifier: it
writes the reward to ``/logs/verifier/reward.txt``) and optionally ``solution/solve.sh``. The
importer (tasks/harbor/importer.py) turns one into this record; ``tests`` are the files of
``tests/``, copied into the sandbox only when grading.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.suite import SLUG

__all__ = ["LOGS_DIR", "REWARD_FILE", "SAMPLE_TASK", "TESTS_DIR", "HarborTask"]

TESTS_DIR = "/tests"  # where Harbor's verifier expects its files
LOGS_DIR = "/logs"  # Harbor's /logs/agent, /logs/verifier
REWARD_FILE = "/logs/verifier/reward.txt"


class HarborTask(BaseModel):
    """One Harbor task directory, imported."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["harbor"] = "harbor"
    id: str = Field(pattern=SLUG, description="the suite's id (from the directory's name)")
    instruction: str = Field(min_length=1, description="instruction.md: what the agent is told")
    image: str = Field(min_length=1, description="the built image of environment/ (a local tag)")
    tests: dict[str, str] = Field(description="tests/ by relative path (test.sh is the verifier); hidden")
    solution: str | None = Field(None, description="solution/solve.sh, the oracle (never shown)")
    agent_timeout_s: float = Field(600.0, gt=0, le=86_400, description="task.toml [agent] timeout_sec")
    verifier_timeout_s: float = Field(600.0, gt=0, le=3_600, description="task.toml [verifier] timeout_sec")
    reward_file: str = Field(
        REWARD_FILE, pattern=r"^/logs/[A-Za-z0-9_./-]+$", description="read after test.sh"
    )

    @field_validator("tests")
    @classmethod
    def _tests(cls, v: dict[str, str]) -> dict[str, str]:
        if "test.sh" not in v:
            raise ValueError("tests needs test.sh (the verifier)")
        for path in v:
            parts = path.split("/")
            if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"test file path {path!r} must be relative, without '..'")
        return v

    @field_validator("reward_file")
    @classmethod
    def _reward_file(cls, v: str) -> str:
        if ".." in v.split("/"):
            raise ValueError("reward_file must not contain '..'")
        return v


# The registration's sample (for `pqrl env check harbor-v1`): the local base image, fitted on first use.
SAMPLE_TASK = {
    "kind": "harbor",
    "id": "harbor-sample",
    "instruction": "Write the word hello to /workspace/hello.txt.",
    "image": "pqrl-sandbox-base:latest",
    "tests": {
        "test.sh": 'if [ "$(cat /workspace/hello.txt 2>/dev/null)" = hello ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n"
    },
    "solution": "echo hello > /workspace/hello.txt\n",
}
