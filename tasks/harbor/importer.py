"""``pqrl tasks import harbor DIR``: Harbor task directories to a suite of kind ``harbor``.

Each directory is read and checked first (instruction.md, task.toml, environment/Dockerfile and
the images its FROM lines name, tests/test.sh); every problem is reported with its file, line and
field, and nothing is built or written unless there are none. Then each task's image is built
offline from ``environment/`` (cached by content), and a thin layer on top fits it to pqrl's
sandbox, whose root filesystem is read-only: ``/tests`` and ``/logs`` become links into the
``/tmp`` tmpfs, and the image's working directory is kept aside and copied into ``/workspace`` at
reset (a directory elsewhere becomes a link to ``/workspace``). The layer also checks for python3,
which the sandbox's exec agent needs.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pqrl.errors import UsageError
from sandboxes.image import ImageBuildError, build_image_from_dockerfile, image_exists, require_engine
from tasks.harbor.image import fit_image
from tasks.harbor.task import HarborTask
from tasks.repo.task import task_id
from tasks.suite import Suite, SuiteManifest, parse_suite

__all__ = ["HarborInvalid", "TaskProblem", "build_failure", "import_harbor", "read_task_dir", "task_dirs"]

_TEXT_LIMIT = 1 << 20  # bytes of tests/ (or of any one file) a task may carry in the suite


@dataclass(frozen=True)
class TaskProblem:
    """One thing wrong with a task directory: the file, its line (0: the file as a whole), the field."""

    path: str
    line: int
    field: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.path} line {self.line}" if self.line else self.path
        return f"{where}: {self.field}: {self.reason}"


class HarborInvalid(UsageError):
    """Every problem found in the task directories; nothing was written."""

    def __init__(self, source: str, problems: list[TaskProblem]) -> None:
        self.problems = problems
        listing = "\n".join(f"  {p}" for p in problems)
        super().__init__(
            f"{source}: {len(problems)} problem(s), nothing written:\n{listing}",
            fix="fix the task directories and run the import again",
        )


def task_dirs(root: Path) -> list[Path]:
    """``root`` itself when it is a task directory, else its subdirectories (not hidden)."""
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory", fix="give a Harbor task directory or a folder of them")
    if any((root / name).exists() for name in ("task.toml", "instruction.md", "environment", "tests")):
        return [root]
    found = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not found:
        raise UsageError(f"{root} holds no task directory", fix="each task is a folder with instruction.md")
    return found


def _text(path: Path, problems: list[TaskProblem], field: str) -> str | None:
    try:
        if path.stat().st_size > _TEXT_LIMIT:
            problems.append(TaskProblem(str(path), 0, field, f"larger than {_TEXT_LIMIT} bytes"))
            return None
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        problems.append(TaskProblem(str(path), 0, field, "missing"))
    except UnicodeDecodeError as e:
        problems.append(TaskProblem(str(path), 0, field, f"not UTF-8 text: {e.reason} at byte {e.start}"))
    except OSError as e:
        problems.append(TaskProblem(str(path), 0, field, f"unreadable: {e.strerror or e}"))
    return None


def _line_of(text: str, section: str, key: str) -> int:
    """The line of ``key`` in ``[section]`` of TOML ``text`` (best effort; 0 when not found)."""
    current = ""
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("["):
            current = stripped.strip("[] ")
        elif current == section and re.match(rf"{re.escape(key)}\s*=", stripped):
            return n
    return 0


def _timeouts(path: Path, problems: list[TaskProblem]) -> dict[str, float]:
    text = _text(path, problems, "task.toml")
    if text is None:
        return {}
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        problems.append(TaskProblem(str(path), int(m.group(1)) if m else 0, "toml", f"unparsable: {e}"))
        return {}
    out: dict[str, float] = {}
    bounds = {"agent": 86_400.0, "verifier": 3_600.0}
    for section, most in bounds.items():
        table = data.get(section, {})
        if not isinstance(table, dict):
            problems.append(TaskProblem(str(path), 0, section, "must be a table"))
            continue
        if "timeout_sec" not in table:
            continue
        value, line = table["timeout_sec"], _line_of(text, section, "timeout_sec")
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= most:
            problems.append(
                TaskProblem(
                    str(path), line, f"{section}.timeout_sec", f"{value!r}: not seconds in (0, {most:g}]"
                )
            )
        else:
            out[f"{section}_timeout_s"] = float(value)
    return out


def _from_lines(dockerfile: Path, problems: list[TaskProblem]) -> None:
    """A problem for each FROM naming an image the local engine lacks (no registry is reachable)."""
    text = _text(dockerfile, problems, "environment/Dockerfile")
    if text is None:
        return
    args: dict[str, str] = {}
    stages: set[str] = set()
    seen_from = False
    for n, raw in enumerate(text.splitlines(), 1):
        words = raw.strip().split()
        if not words or words[0].startswith("#"):
            continue
        op = words[0].upper()
        if op == "ARG" and not seen_from and len(words) > 1:
            name, _, default = words[1].partition("=")
            args[name] = default.strip("\"'")
        elif op == "FROM":
            seen_from = True
            rest = [w for w in words[1:] if not w.startswith("--")]
            if not rest:
                problems.append(TaskProblem(str(dockerfile), n, "FROM", "names no image"))
                continue
            ref = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), ""), rest[0])
            if len(rest) >= 3 and rest[1].upper() == "AS":
                stages.add(rest[2].lower())
            if ref.lower() in stages or ref == "scratch":
                continue
            if not ref or not image_exists(ref):
                why = (
                    f"image {ref or rest[0]!r} is not in the local Docker engine and no registry is reachable"
                )
                problems.append(TaskProblem(str(dockerfile), n, "FROM", f"{why}: build or load it first"))
    if not seen_from:
        problems.append(TaskProblem(str(dockerfile), 0, "FROM", "no FROM line"))


def _tests(tests: Path, problems: list[TaskProblem]) -> dict[str, str]:
    if not (tests / "test.sh").is_file():
        problems.append(TaskProblem(str(tests / "test.sh"), 0, "tests/test.sh", "missing (the verifier)"))
        return {}
    files: dict[str, str] = {}
    for path in sorted(p for p in tests.rglob("*") if p.is_file() or p.is_symlink()):
        rel = str(path.relative_to(tests))
        if path.is_symlink():
            problems.append(
                TaskProblem(str(path), 0, f"tests/{rel}", "a symbolic link (give the file itself)")
            )
        elif (text := _text(path, problems, f"tests/{rel}")) is not None:
            files[rel] = text
    if sum(len(t) for t in files.values()) > _TEXT_LIMIT:
        problems.append(TaskProblem(str(tests), 0, "tests", f"larger than {_TEXT_LIMIT} bytes in all"))
    return files


def read_task_dir(d: Path) -> tuple[dict[str, Any], list[TaskProblem]]:
    """The task's fields but its image (read from ``d``), and every problem found."""
    problems: list[TaskProblem] = []
    fields: dict[str, Any] = {"id": task_id(d.name)}
    instruction = _text(d / "instruction.md", problems, "instruction.md")
    if instruction is not None and not instruction.strip():
        problems.append(TaskProblem(str(d / "instruction.md"), 0, "instruction.md", "empty"))
    fields["instruction"] = instruction
    fields.update(_timeouts(d / "task.toml", problems))
    _from_lines(d / "environment" / "Dockerfile", problems)
    fields["tests"] = _tests(d / "tests", problems)
    if (d / "solution" / "solve.sh").exists():
        fields["solution"] = _text(d / "solution" / "solve.sh", problems, "solution/solve.sh")
    return fields, problems


def _image_name(slug: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", slug).strip("-") or "task"


def build_task_image(d: Path, slug: str, progress: Callable[[str], None]) -> str:
    """The sandbox image of task directory ``d``: its environment/ built, then the fitting layer."""
    name = _image_name(slug)
    env = d / "environment"
    base = build_image_from_dockerfile(
        env / "Dockerfile", name=f"pqrl-harbor-env-{name}", context=env, progress=progress
    )
    return fit_image(base, name=f"pqrl-harbor-{name}", progress=progress)


def import_harbor(
    root: str | Path, *, name: str | None = None, progress: Callable[[str], None] = print
) -> Suite:
    """The suite of the task directories under ``root``; raises HarborInvalid listing every problem."""
    root = Path(root)
    dirs = task_dirs(root)
    require_engine()  # else every FROM is "missing"
    read = [(d, *read_task_dir(d)) for d in dirs]
    problems = [p for _, _, found in read for p in found]
    owner: dict[str, Path] = {}
    for d, fields, _ in read:
        if fields["id"] in owner:
            problems.append(
                TaskProblem(str(d), 0, "id", f"{fields['id']!r} is also {owner[fields['id']]}'s id")
            )
        owner.setdefault(fields["id"], d)
    if problems:
        raise HarborInvalid(str(root), problems)
    tasks = []
    for d, fields, _ in read:
        try:
            image = build_task_image(d, fields["id"], progress)
        except ImageBuildError as e:
            problems.append(TaskProblem(str(d / "environment"), 0, "image", build_failure(str(e))))
            continue
        tasks.append(HarborTask.model_validate({**fields, "image": image}))
    if problems:
        raise HarborInvalid(str(root), problems)
    manifest = SuiteManifest(
        name=task_id(name or root.resolve().name), version="1", env_id="harbor-v1", kind="harbor"
    )
    suite = Suite(manifest, tuple(tasks))
    return parse_suite(suite.to_jsonl(), source=str(root))  # the suite as a reader will check it


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# docker's own chatter, never the cause: the builder's notices, step headers, intermediate containers
_NOISE = re.compile(
    r"^(DEPRECATED:|Install the buildx|https://docs\.docker\.com/|Sending build context|Step \d+/\d+ :"
    r"|---> |Removing intermediate container|Successfully )"
)
_OFFLINE = re.compile(
    r"Temporary failure in name resolution|Could not resolve host|Name or service not known"
    r"|Network is unreachable|Failed to establish a new connection|Could not resolve '"
    r"|Temporary failure resolving|unable to resolve host address|getaddrinfo EAI_AGAIN",
    re.IGNORECASE,
)


def build_failure(output: str, keep: int = 10) -> str:
    """A failed image build in one line: the last ``keep`` lines of the build's own output (the
    failing command's error sits above docker's "returned a non-zero code"), joined by " | ", and a
    hint when the output shows a download that found no network."""
    lines = [
        _ANSI.sub("", line).split("DEPRECATED: The legacy builder")[0].strip() for line in output.splitlines()
    ]
    lines = [line for line in lines if line and not _NOISE.match(line)]
    text = " | ".join(lines[-keep:])[-1500:] or "the build failed with no output"
    if _OFFLINE.search(output):
        text += (
            " (image builds run without network: copy what the Dockerfile downloads into "
            "environment/ or start FROM a local image that has it)"
        )
    return text
