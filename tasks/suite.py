"""The task-suite format: a manifest line, then one task per line (JSONL), validated by pydantic.

    {"suite": {"name": "calc-easy", "version": "1", "env_id": "calc-v1", "kind": "calc",
               "reward": "exact_match", "defaults": {"shots": 1}}}
    {"id": "c-0", "kind": "calc", "question": "...", "answer": "42"}
    ...

A suite is identified by its name and a content hash (``name@sha12``) of its canonical JSON, so the
same suite submitted twice is recognised. Validation reports every problem at once, each with its
line, task id and field.

``kind`` is open: the manifest's environment declares the model of its tasks (its ``task_model``,
see env_server.registry), and the built-in kinds below are the built-in environments' models, met
by the same lookup. The manifest is also checked against its environment (tasks.suite_checks).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tasks.rewards import RewardSpec
from tasks.suite_checks import EnvCheck, check_environment_of, field_path

__all__ = [
    "CalcTask",
    "CodingTask",
    "DataTask",
    "OpenTask",
    "Problem",
    "QATask",
    "Suite",
    "SuiteInvalid",
    "SuiteManifest",
    "load_suite",
    "parse_suite",
]

SLUG = r"^[a-z0-9][a-z0-9_.-]{0,63}$"  # ids, names and kinds


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SuiteManifest(_Strict):
    """What a suite is and how its tasks run and are scored."""

    name: str = Field(pattern=SLUG, description="lower-case slug")
    version: str = Field(min_length=1, max_length=32)
    env_id: str = Field(description="registered environment the tasks run in, e.g. calc-v1")
    kind: str = Field(pattern=SLUG, description="the kind its environment's task model declares")
    reward: RewardSpec = Field(
        "env", description="the scoring: 'env' (the environment's evaluate) or weighted reward functions"
    )
    description: str = ""
    defaults: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments for the environment"
    )


class CalcTask(_Strict):
    """An arithmetic word problem with one exact numeric answer."""

    kind: Literal["calc"] = "calc"
    id: str = Field(pattern=SLUG)
    question: str = Field(min_length=1)
    answer: str = Field(min_length=1)
    expression: str | None = Field(default=None, description="how the answer was computed (gold solution)")


class QATask(_Strict):
    """A question with one or more reference answers (SQuAD-normalised exact match and F1)."""

    kind: Literal["qa"] = "qa"
    id: str = Field(pattern=SLUG)
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
    id: str = Field(pattern=SLUG)
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
    id: str = Field(pattern=SLUG)
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


class OpenTask(BaseModel):
    """A task of an environment that declares no task model: an id, its kind, any other fields."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: str = Field(pattern=SLUG)
    id: str = Field(pattern=SLUG)


AnyTask = Any  # an instance of the suite's task model


@dataclass(frozen=True)
class Problem:
    line: int
    task_id: str | None
    field: str
    reason: str
    NAMED: ClassVar[str] = "task "  # what the id names, before it

    def __str__(self) -> str:
        where = f"line {self.line}" + (f" ({self.NAMED}{self.task_id})" if self.task_id else "")
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

    def with_manifest(self, changes: dict[str, Any], *, source: str) -> Suite:
        """The same tasks under the manifest with ``changes`` (a job's own ``reward``), the new
        manifest checked as a suite file's first line is; the tasks were checked already."""
        manifest, _, problems = _manifest({"suite": self.manifest.model_dump() | changes}, 1)
        if problems:
            raise SuiteInvalid(source, problems)
        assert manifest is not None
        return Suite(manifest, self.tasks)

    def task(self, task_id: str) -> AnyTask:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(f"suite {self.id} has no task {task_id!r}")


def _problems(e: ValidationError, line: int, task_id: str | None, prefix: str = "") -> list[Problem]:
    return [Problem(line, task_id, prefix + (field_path(err["loc"]) or "(record)"), err["msg"])
            for err in e.errors()]  # fmt: skip


def _manifest(record: Any, n: int) -> tuple[SuiteManifest | None, EnvCheck | None, list[Problem]]:
    """The manifest, what its environment gives (the task model) and every problem with both."""
    if not isinstance(record, dict) or set(record) != {"suite"}:
        return None, None, [Problem(n, None, "suite", 'the first line must be {"suite": {...manifest...}}')]
    try:
        manifest = SuiteManifest.model_validate(record["suite"])
    except ValidationError as e:
        return None, None, _problems(e, n, None, "suite.")
    env = check_environment_of(manifest.env_id, manifest.kind, manifest.defaults, manifest.reward)
    return manifest, env, [Problem(n, None, f"suite.{f}", r) for f, r in env.findings]


def _task(
    record: Any, n: int, manifest: SuiteManifest | None, model: type[BaseModel] | None
) -> tuple[Any, list[Problem]]:
    task_id = record.get("id") if isinstance(record, dict) and isinstance(record.get("id"), str) else None
    if manifest is not None and isinstance(record, dict) and record.get("kind") != manifest.kind:
        return None, [
            Problem(n, task_id, "kind", f"{record.get('kind')!r} in a suite of kind {manifest.kind!r}")
        ]
    try:
        return (model or OpenTask).model_validate(record), []
    except ValidationError as e:
        return None, _problems(e, n, task_id)
    except Exception as e:  # a plug-in model's validator that raised something else
        return None, [Problem(n, task_id, "(record)", f"{type(e).__name__}: {e}")]


def parse_suite(text: str, *, source: str = "<suite>") -> Suite:
    """Parses and validates suite text. Raises SuiteInvalid listing every problem."""
    problems: list[Problem] = []
    manifest: SuiteManifest | None = None
    model: type[BaseModel] | None = None
    tasks: list[Any] = []
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
        except RecursionError:
            problems.append(Problem(n, None, "(json)", "nested too deeply to read"))
            continue
        if n == lines[0][0]:
            manifest, env, found = _manifest(record, n)
            model = env.task_model if env is not None else None
            problems += found
            continue
        task, found = _task(record, n, manifest, model)
        problems += found
        if task is None:
            continue
        if task.id in seen:
            problems.append(Problem(n, task.id, "id", f"duplicate of the task on line {seen[task.id]}"))
        seen.setdefault(task.id, n)
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
    except (OSError, UnicodeDecodeError) as e:
        raise SuiteInvalid(str(p), [Problem(0, None, "file", str(e))]) from None
    return parse_suite(text, source=str(p))
