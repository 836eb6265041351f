"""The task-suite format: a manifest line, then one task per line (JSONL), validated by pydantic.

    {"suite": {"name": "calc-easy", "version": "1", "env_id": "calc-v1", "kind": "calc",
               "reward": "exact_match", "defaults": {"shots": 1}}}
    {"id": "c-0", "kind": "calc", "question": "...", "answer": "42"}
    ...

A suite is identified by its name and a content hash (``name@sha12``) of its canonical JSON, so the
same suite submitted twice is recognised. Validation reports every problem at once, each with its
line, task id and field.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

__all__ = [
    "CalcTask",
    "CodingTask",
    "DataTask",
    "Problem",
    "QATask",
    "Suite",
    "SuiteInvalid",
    "SuiteManifest",
    "Task",
    "load_suite",
    "parse_suite",
]

_SLUG = r"^[a-z0-9][a-z0-9_.-]{0,63}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SuiteManifest(_Strict):
    """What a suite is and how its tasks run and are scored."""

    name: str = Field(pattern=_SLUG, description="lower-case slug")
    version: str = Field(min_length=1, max_length=32)
    env_id: str = Field(description="registered environment the tasks run in, e.g. calc-v1")
    kind: Literal["qa", "coding", "calc", "data"]
    reward: Literal["exact_match", "qa_em_f1", "unit_tests"]
    description: str = ""
    defaults: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments for the environment"
    )


class CalcTask(_Strict):
    """An arithmetic word problem with one exact numeric answer."""

    kind: Literal["calc"] = "calc"
    id: str = Field(pattern=_SLUG)
    question: str = Field(min_length=1)
    answer: str = Field(min_length=1)
    expression: str | None = Field(default=None, description="how the answer was computed (gold solution)")


class QATask(_Strict):
    """A question with one or more reference answers (SQuAD-normalised exact match and F1)."""

    kind: Literal["qa"] = "qa"
    id: str = Field(pattern=_SLUG)
    question: str = Field(min_length=1)
    answers: list[str] = Field(min_length=1)
    hops: int = Field(default=1, ge=1)

    @field_validator("answers")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if any(not a.strip() for a in v):
            raise ValueError("answers must not be blank")
        return v


class CodingTask(_Strict):
    """A repository with a bug, an issue text and hidden tests (SWE-bench style)."""

    kind: Literal["coding"] = "coding"
    id: str = Field(pattern=_SLUG)
    repo: dict[str, str] = Field(min_length=1, description="path -> content of the repository snapshot")
    issue: str = Field(min_length=1)
    hidden_tests: dict[str, str] = Field(
        min_length=1, description="path -> content, copied in after the agent"
    )
    fail_to_pass: list[str] = Field(min_length=1)
    pass_to_pass: list[str] = Field(default_factory=list)
    gold_patch: str | None = None


class DataTask(_Strict):
    """A question about files written into the agent's sandbox, with one exact numeric answer."""

    kind: Literal["data"] = "data"
    id: str = Field(pattern=_SLUG)
    question: str = Field(min_length=1)
    answer: str = Field(min_length=1)
    files: dict[str, str] = Field(
        min_length=1, description="file name in /workspace -> content (names without '/')"
    )
    solution: str | None = Field(default=None, description="a command that prints the answer (gold)")

    @field_validator("files")
    @classmethod
    def _plain_names(cls, v: dict[str, str]) -> dict[str, str]:
        if any(not n or "/" in n or n in (".", "..") for n in v):
            raise ValueError("file names must be plain names in /workspace (no '/')")
        return v


AnyTask = CalcTask | QATask | CodingTask | DataTask
Task = Annotated[AnyTask, Field(discriminator="kind")]
_TASK = TypeAdapter(Task)


@dataclass(frozen=True)
class Problem:
    line: int
    task_id: str | None
    field: str
    reason: str

    def __str__(self) -> str:
        where = f"line {self.line}" + (f" (task {self.task_id})" if self.task_id else "")
        return f"{where}: {self.field}: {self.reason}"


class SuiteInvalid(ValueError):
    """Every problem found in a suite file."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s):\n{lines}")


@dataclass(frozen=True)
class Suite:
    manifest: SuiteManifest
    tasks: tuple[AnyTask, ...]

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_jsonl().encode()).hexdigest()[:12]

    @property
    def id(self) -> str:
        return f"{self.manifest.name}@{self.digest}"

    def to_jsonl(self) -> str:
        """The canonical text: sorted keys, no spaces; parse_suite(to_jsonl()) round-trips."""
        lines = [json.dumps({"suite": self.manifest.model_dump()}, sort_keys=True, separators=(",", ":"))]
        lines += [json.dumps(t.model_dump(), sort_keys=True, separators=(",", ":")) for t in self.tasks]
        return "\n".join(lines) + "\n"

    def task(self, task_id: str) -> AnyTask:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(f"suite {self.id} has no task {task_id!r}")


def _problems(e: ValidationError, line: int, task_id: str | None, prefix: str = "") -> list[Problem]:
    out = []
    for err in e.errors():
        loc = [str(p) for p in err["loc"] if p not in ("calc", "qa", "coding", "data")]  # drop the union tag
        out.append(Problem(line, task_id, prefix + (".".join(loc) or "(record)"), err["msg"]))
    return out


def parse_suite(text: str, *, source: str = "<suite>") -> Suite:
    """Parses and validates suite text. Raises SuiteInvalid listing every problem."""
    problems: list[Problem] = []
    manifest: SuiteManifest | None = None
    tasks: list[AnyTask] = []
    seen: dict[str, int] = {}
    lines = [(n, s) for n, s in enumerate(text.splitlines(), 1) if s.strip()]
    if not lines:
        raise SuiteInvalid(source, [Problem(1, None, "suite", "the file is empty")])
    for n, raw in lines:
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as e:
            problems.append(Problem(n, None, "(json)", f"not valid JSON: {e.msg} at column {e.colno}"))
            continue
        if n == lines[0][0]:
            if not isinstance(record, dict) or set(record) != {"suite"}:
                problems.append(
                    Problem(n, None, "suite", 'the first line must be {"suite": {...manifest...}}')
                )
                continue
            try:
                manifest = SuiteManifest.model_validate(record["suite"])
            except ValidationError as e:
                problems += _problems(e, n, None, "suite.")
            continue
        task_id = record.get("id") if isinstance(record, dict) and isinstance(record.get("id"), str) else None
        try:
            task = _TASK.validate_python(record)
        except ValidationError as e:
            problems += _problems(e, n, task_id)
            continue
        if task.id in seen:
            problems.append(Problem(n, task.id, "id", f"duplicate of the task on line {seen[task.id]}"))
        seen.setdefault(task.id, n)
        if manifest is not None and task.kind != manifest.kind:
            problems.append(
                Problem(n, task.id, "kind", f"{task.kind!r} in a suite of kind {manifest.kind!r}")
            )
        tasks.append(task)
    if manifest is not None and not tasks and not problems:
        problems.append(Problem(lines[0][0], None, "tasks", "the suite has no tasks"))
    if problems:
        raise SuiteInvalid(source, problems)
    assert manifest is not None
    return Suite(manifest, tuple(tasks))


def load_suite(path: str | Path) -> Suite:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SuiteInvalid(str(p), [Problem(0, None, "file", str(e))]) from None
    return parse_suite(text, source=str(p))
