"""``coding-v1``: fix a bug in a small repository from an issue report, graded by hidden tests.

Reset copies the task's repository into ``/workspace`` of the session's sandbox and commits it as
the base commit (fixed author and dates, so the same task always gets the same commit; no
history before it). The agent gets the issue and four tools: ``run`` (a shell command),
``read_file``, ``write_file``, ``edit_file`` (replace one unique string) and ``submit``. The
reward comes from the coding grader (tasks/coding/grader.py): the source-file diff against that
base, applied in a fresh container, with the hidden tests copied in after.

A task is a CodingTask dict, or ``{"ref": "<task id>"}`` naming a task of the built-in suite.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from env_server import Message, RewardResult, tool
from env_server.builtin import ShellEnv
from env_server.types import Observation, ToolCall
from sandboxes.protocol import SandboxError
from tasks.coding.capture import WORKSPACE, Ungradable
from tasks.coding.diffs import apply_patch, source_files
from tasks.coding.grader import CodingGrader
from tasks.suite import CodingTask, Suite

__all__ = ["GIT_ENV", "CodingEnv", "builtin_suite", "demonstration"]

SYSTEM = """\
You are a software engineer fixing a bug in the repository in /workspace (a git repository; its \
first commit is the code as reported). Tools:
- run: runs a shell command in /workspace (python3 and pytest are installed; there is no network)
- read_file / write_file: read or replace a whole file
- edit_file: replace one exact, unique piece of text in a file
- submit: call it when you are done; your changes are then graded
Grading applies only your changes to the source files listed below to a clean copy of the \
repository and runs hidden tests. Changes to tests or configuration are discarded. The fixed \
code must stay plain Python: standard-library imports only from math, re, string, collections, \
dataclasses, typing, functools, itertools, heapq, bisect, enum, fractions, decimal, datetime and \
abc; no file, process or interpreter access (os, sys, open, eval, exec, getattr, dunder \
attributes)."""

GIT_ENV = {
    "GIT_AUTHOR_NAME": "pqrl",
    "GIT_AUTHOR_EMAIL": "pqrl@localhost",
    "GIT_COMMITTER_NAME": "pqrl",
    "GIT_COMMITTER_EMAIL": "pqrl@localhost",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00",
}
_SETUP = (
    "git init -q -b main && git config user.name agent && git config user.email agent@localhost"
    " && printf '__pycache__/\\n.pytest_cache/\\n*.pyc\\n' > .git/info/exclude"
    " && git add -A && git commit -q -m 'Base commit' && git rev-parse HEAD"
)


# Worked examples shown as earlier turns (config ``shots``), about repositories in no task: the
# issue as reset lays it out, then (tool, arguments, what it returned) steps ending in submit. The
# first runs the tests, reads, edits and checks; the second goes straight to the code.
_DEMOS = (
    ("calc: add(2, 3) returns -1 instead of 5", "calc",
     (("run", {"command": "python3 -m pytest -q --tb=line"},
       "[exit code 1]\nF" + " " * 72 + "[100%]\n" + " FAILURES ".center(80, "=")
       + "\n/workspace/tests/test_calc.py:5: assert -1 == 5\n" + " short test summary info ".center(80, "=")
       + "\nFAILED tests/test_calc.py::test_add - assert -1 == 5\n1 failed in 0.01s\n"),
      ("read_file", {"path": "calc.py"}, "def add(a, b):\n    return a - b\n"),
      ("edit_file", {"path": "calc.py", "old": "return a - b", "new": "return a + b"},
       "edited /workspace/calc.py"),
      ("run", {"command": "python3 -m pytest -q --tb=line"},
       "[exit code 0]\n." + " " * 72 + "[100%]\n1 passed in 0.01s\n"),
      ("submit", {}, "submitted"))),
    ("shapes: square_area(3) returns 6 instead of 9", "shapes",
     (("read_file", {"path": "shapes.py"}, "def square_area(side):\n    return side * 2\n"),
      ("edit_file", {"path": "shapes.py", "old": "side * 2", "new": "side * side"},
       "edited /workspace/shapes.py"),
      ("submit", {}, "submitted"))),
)  # fmt: skip


MAX_SHOTS = len(_DEMOS)


def _issue_message(issue: str, files: list[str], sources: list[str]) -> str:
    listing = "\n".join(f"- {p}" for p in sorted(files))
    graded = ", ".join(sources)
    return f"{issue}\n\n---\nRepository files:\n{listing}\n\nSource files (only these are graded): {graded}"


def demonstration(shots: int) -> list[Message]:
    """``shots`` worked bug fixes as earlier turns of the conversation."""
    if not 0 <= shots <= len(_DEMOS):
        raise ValueError(f"coding-v1: shots must be 0 to {len(_DEMOS)}, got {shots}")
    out: list[Message] = []
    for issue, module, steps in _DEMOS[:shots]:
        files = [f"{module}.py", f"tests/test_{module}.py"]
        out.append(Message(role="user", content=_issue_message(issue, files, [f"{module}.py"])))
        for name, arguments, returned in steps:
            out += [Message.calling(name, **arguments),
                    Message(role="tool", name=name, content=returned)]  # fmt: skip
    return out


@cache
def builtin_suite() -> Suite:
    """The shipped coding suite (tasks/coding/suite.jsonl), loaded once."""
    from tasks.coding.generate import load_coding_suite

    return load_coding_suite()


class CodingConfig(BaseModel):
    """The keyword arguments of coding-v1 (a suite's ``defaults``)."""

    model_config = ConfigDict(extra="forbid")
    shots: int = Field(0, ge=0, le=len(_DEMOS), description="worked bug fixes shown before the issue")


def _task(task: dict[str, Any]) -> CodingTask:
    if set(task) == {"ref"}:
        found = builtin_suite().task(str(task["ref"]))
        assert isinstance(found, CodingTask)
        return found
    return CodingTask.model_validate(task)


def _tar(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 1704067200
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class CodingEnv(ShellEnv):
    """Task: a CodingTask dict (or ``{"ref": id}``). Reward: 1 when every hidden test passes.
    Config: ``shots``, worked bug fixes shown before the issue (0 to 2, default 0)."""

    needs_sandbox = True
    task_model = CodingTask
    config_model = CodingConfig
    settings: CodingConfig
    reward_names = ("unit_tests",)

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.task = _task(task)
        self.result: RewardResult | None = None
        await self.sandbox.upload(_tar(self.task.repo), WORKSPACE)
        setup = await self.sandbox.exec(_SETUP, cwd=WORKSPACE, env=GIT_ENV, timeout=60)
        if not setup.ok:
            raise SandboxError(f"coding-v1: creating the base commit failed: {setup.text()[-500:]}")
        self.base_commit = setup.stdout.decode().strip()
        user = _issue_message(
            self.task.issue, list(self.task.repo), source_files(self.task.repo, self.task.hidden_tests)
        )
        shots = demonstration(self.settings.shots)
        return self.observation(
            [Message(role="system", content=SYSTEM), *shots, Message(role="user", content=user)]
        )

    @tool
    async def edit_file(self, path: str, old: str, new: str) -> str:
        """Replaces one exact occurrence of ``old`` with ``new`` in a file.

        Args:
            path: absolute, or relative to /workspace.
            old: the exact text to replace; it must occur exactly once in the file.
            new: the replacement text.
        """
        full = path if path.startswith("/") else f"{WORKSPACE}/{path}"
        text = (await self.sandbox.read_file(full, max_bytes=1 << 20)).decode("utf-8")
        count = text.count(old) if old else 0
        if count != 1:
            raise ValueError(f"`old` occurs {count} times in {full}; it must occur exactly once")
        await self.sandbox.write_file(full, text.replace(old, new, 1).encode())
        return f"edited {full}"

    @classmethod
    def worked_example(cls, task: dict[str, Any]) -> list[ToolCall] | None:
        """The gold patch's files written with write_file (a deleted one removed with run), then submit."""
        found = _task(task)
        if not found.gold_patch:
            return None
        steps: list[tuple[str, dict[str, Any]]] = []
        for path, text in sorted(apply_patch(found.repo, found.gold_patch).items()):
            if text is None:
                steps.append(("run", {"command": f"rm -f -- {shlex.quote(path)}"}))
            else:
                steps.append(("write_file", {"path": path, "content": text}))
        steps.append(("submit", {}))
        return [ToolCall(name=n, arguments=a, id=f"w{i}") for i, (n, a) in enumerate(steps)]

    async def evaluate(self) -> RewardResult:
        if self.result is not None:
            return self.result
        grader = await CodingGrader.for_sandbox(self.sandbox)
        try:
            graded = await grader.grade_workspace(self.task, self.sandbox, self.base_commit)
            result = RewardResult(reward=graded.reward, info={"task_id": self.task.id, **graded.info})
        except Ungradable as e:  # the agent's doing (a FIFO, a huge file for a source file): it scores 0
            result = RewardResult(reward=0.0, info={"task_id": self.task.id, **e.info})
        if self.done:  # nothing can change after submit: grade once
            self.result = result
        return result
