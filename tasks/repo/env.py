"""``repo-v1``: resolve an issue in a real repository, graded by its hidden tests.

The session's sandbox runs the task's own ``image`` (so each image has its own warm pool). Reset
copies ``repo_path`` into ``/workspace`` and records the base commit there (the image's commit;
a new one with fixed identity and dates when the copy holds uncommitted files or no history). The
agent gets ``problem_statement`` and coding-v1's tools. The hidden ``test_patch`` never enters
this sandbox: tasks/repo/grading.py applies it in a fresh container after the agent's diff.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import Field

from env_server import Message, RewardResult
from env_server.types import Observation, ToolCall
from pqrl.faults import BadTask
from sandboxes.hardening import SandboxSettings
from sandboxes.protocol import Sandbox
from tasks.coding.env import GIT_ENV, CodingConfig, CodingEnv, demonstration
from tasks.coding.grader import fresh_sandboxes
from tasks.repo.grading import Ungradable, capture_diff, grade_patch
from tasks.repo.task import RepoTask

__all__ = ["RepoConfig", "RepoEnv"]

SYSTEM = """\
You are a software engineer resolving an issue in the repository in /workspace (a git \
repository at the reported commit, its dependencies installed; there is no network). Tools:
- run: runs a shell command in /workspace
- read_file / write_file: read or replace a whole file
- edit_file: replace one exact, unique piece of text in a file
- submit: call it when you are done; your changes are then graded
Grading takes your changes to the repository (committed or not) against the reported commit, \
applies them to a clean copy and runs hidden tests there."""

# Copies the repository, then makes sure HEAD holds exactly the copied files, so the agent's diff
# against it applies to a fresh copy of the same image. Hooks and signing stay off.
_RESET = (
    'cp -a "$1"/. /workspace && cd /workspace && { [ -d .git ] || git init -q; }'
    " && git add -A && if ! git rev-parse -q --verify HEAD >/dev/null || ! git diff --cached --quiet;"
    " then git -c commit.gpgsign=false commit -q --no-verify --allow-empty -m 'pqrl base'; fi"
    " && git rev-parse HEAD"
)


class RepoConfig(CodingConfig):
    """The keyword arguments of repo-v1 (a suite's ``defaults``): coding-v1's ``shots`` (worked
    fixes shown before the issue: a small model calls no tool without them) and ``test_timeout``."""

    # under the HTTP env client's 300 s per request, with room for the copy and the container
    test_timeout: float = Field(240.0, gt=0, le=3600, description="seconds for the hidden test run")
    verdict: Literal["values", "junit"] = Field(
        "values",
        description="values: the listed tests' probe record must match the gold's (tasks/repo/values.py); "
        "junit: their JUnit outcomes alone",
    )


class RepoEnv(CodingEnv):
    """Task: a RepoTask dict. Reward: 1 when every FAIL_TO_PASS and PASS_TO_PASS test passes (and,
    by default, records the gold solution's values: tasks/repo/values.py). Config: ``shots`` (0
    to 2, default 0), ``test_timeout``, seconds for the hidden test run (default 240);
    ``verdict``, values or junit."""

    task_model = RepoTask  # type: ignore[assignment]
    config_model = RepoConfig  # type: ignore[assignment]
    settings: RepoConfig
    reward_names = ("unit_tests",)
    # Real repositories are larger than the generated ones (the workspace tmpfs counts as memory).
    sandbox_settings = SandboxSettings(memory_mb=4096, workspace_mb=2048)

    def _box(self) -> Sandbox:
        if self.sandbox is None:
            raise RuntimeError("repo-v1 needs a sandbox (the server attaches one before reset)")
        return self.sandbox

    @classmethod
    def sandbox_settings_for(cls, task: dict[str, Any]) -> SandboxSettings:
        base = cls.sandbox_settings or SandboxSettings()
        return dataclasses.replace(base, image=RepoTask.model_validate(task).image)

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.repo_task = RepoTask.model_validate(task)
        self.result: RewardResult | None = None
        setup = await self._box().exec(
            ["sh", "-c", _RESET, "sh", self.repo_task.repo_path], cwd="/", env=GIT_ENV, timeout=600
        )
        if not setup.ok:
            raise BadTask(f"repo-v1: copying {self.repo_task.repo_path} failed: {setup.text()[-500:]}")
        self.base_commit = setup.stdout.decode().strip().splitlines()[-1]
        return self.observation(
            [
                Message(role="system", content=SYSTEM),
                *demonstration(self.settings.shots),
                Message(role="user", content=self.repo_task.problem_statement),
            ]
        )

    async def evaluate(self) -> RewardResult:
        if self.result is not None:
            return self.result
        info: dict[str, Any] = {"task_id": self.repo_task.id, "instance_id": self.repo_task.instance_id}
        try:
            patch = await capture_diff(self._box(), self.repo_task, self.base_commit)
        except Ungradable as e:  # the agent broke its own git state: its failure
            return RewardResult(reward=0.0, info={**info, "reason": str(e)})
        make = await fresh_sandboxes(self._box())
        graded = await grade_patch(
            self.repo_task, patch, make, timeout=self.settings.test_timeout, verdict=self.settings.verdict
        )
        result = RewardResult(reward=graded.reward, info={**info, "patch_bytes": len(patch), **graded.info})
        if self.done:  # nothing can change after submit: grade once
            self.result = result
        return result

    @classmethod
    def worked_example(cls, task: dict[str, Any]) -> list[ToolCall] | None:
        """Writes the gold patch outside the workspace, applies it with git, submits."""
        gold = RepoTask.model_validate(task).patch
        if not gold:
            return None
        path = "/tmp/pqrl-gold.patch"
        return [
            ToolCall(name="write_file", arguments={"path": path, "content": gold}, id="w0"),
            ToolCall(name="run", arguments={"command": f"git apply --whitespace=nowarn {path}"}, id="w1"),
            ToolCall(name="submit", arguments={}, id="w2"),
        ]
