"""A coding task from a real repository, in the fields SWE-bench and its descendants use.

The repository sits in the task's ``image`` at ``repo_path`` at ``base_commit`` with its
dependencies installed (an image the user's Docker has, or one pqrl built offline from a recipe:
sandboxes/recipes.py). The agent gets ``problem_statement``; the grader applies the agent's diff,
then ``test_patch`` (never shown to the agent), runs ``test_command`` and requires every id in
``fail_to_pass`` and ``pass_to_pass`` to be present and to pass. ``patch`` is the gold solution.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.suite import SLUG

__all__ = ["RepoTask", "not_node_id", "task_id"]


class RepoTask(BaseModel):
    """One instance: a repository at a commit, an issue, a gold patch and hidden tests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["repo"] = "repo"
    id: str = Field(pattern=SLUG, description="the suite's id (task_id of instance_id)")
    instance_id: str = Field(min_length=1, max_length=256, description="the id in its source dataset")
    repo: str = Field(min_length=1, description="where the repository comes from, e.g. owner/name")
    base_commit: str = Field(pattern=r"^[0-9a-f]{7,64}$")
    problem_statement: str = Field(min_length=1)
    patch: str | None = Field(None, description="the gold patch (a unified diff)")
    test_patch: str = Field(min_length=1, description="the hidden tests (a unified diff)")
    fail_to_pass: list[str] = Field(min_length=1, description="test ids the gold fixes")
    pass_to_pass: list[str] = Field(default_factory=list, description="test ids that must keep passing")
    test_command: str = Field(
        "python3 -m pytest -p no:cacheprovider",
        min_length=1,
        description="the command the test ids are appended to (pytest node ids by default)",
    )
    image: str = Field(min_length=1, description="the Docker image holding the repository")
    repo_path: str = Field("/repo", pattern=r"^/[A-Za-z0-9_./-]*$", description="its path in the image")

    @field_validator("fail_to_pass", "pass_to_pass")
    @classmethod
    def _ids(cls, v: list[str]) -> list[str]:
        if any(not t.strip() for t in v):
            raise ValueError("test ids must not be blank")
        if len(set(v)) != len(v):
            raise ValueError("test ids must be unique")
        return v

    @model_validator(mode="after")
    def _node_ids(self) -> RepoTask:
        # the grader runs the files the ids name and reads their names back from pytest's JUnit
        # report (it appends --junitxml), whatever the test command: so every id is a node id
        for name, ids in (("fail_to_pass", self.fail_to_pass), ("pass_to_pass", self.pass_to_pass)):
            why = next(filter(None, map(not_node_id, ids)), None)
            if why:
                raise ValueError(f"{name}: {why}")
        return self


_TEST_FILES = (".py", ".txt", ".rst", ".md")  # pytest collects modules and, for doctests, text files


def not_node_id(test: str) -> str | None:
    """Why ``test`` is not a pytest node id ``path::name`` (None: it is one). The ids are the files
    the grader runs and the names it reads from JUnit: unittest's ``name (module.Class)`` or a bare
    name (Django, SymPy) names no file, so no test of it could ever pass."""
    path, sep, name = test.partition("::")
    if "[" in name and not name.endswith("]"):  # a parametrized id cut at a space (some datasets do)
        return f"test id {test[:120]!r} is cut short (its parameters never close with ']'): give the whole id"
    if sep and path.endswith(_TEST_FILES) and name.strip():
        return None
    return (
        f"test id {test[:120]!r} is not a pytest node id: repo-v1 runs pytest and needs ids "
        "path::name (e.g. tests/test_x.py::TestX::test_y); convert the ids or leave the instance out"
    )


def task_id(instance_id: str) -> str:
    """A suite id from a dataset's instance id: lower case, other characters as '-', at most 64."""
    slug = re.sub(r"[^a-z0-9_.-]+", "-", instance_id.lower()).strip("-.") or "task"
    if len(slug) > 64:
        slug = f"{slug[:55]}-{hashlib.sha256(instance_id.encode()).hexdigest()[:8]}"
    return slug
