"""``pqrl tasks import swebench``: SWE-bench style instances -> a suite of kind ``repo`` (repo-v1).

Reads the field names SWE-bench and its descendants (SWE-Gym, SWE-smith, R2E-Gym, nebius
SWE-bench-extra) share: ``instance_id``, ``repo``, ``base_commit``, ``problem_statement``,
``patch``, ``test_patch``, ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` (a JSON-encoded string or a list:
both occur), and an optional prebuilt image (``image_name``; R2E-Gym's ``docker_image``). An
instance without one gets an image built offline from a local clone (``--repos DIR``) with
sandboxes.recipes: one per (repository, base commit, requirements), shared by its instances. The
image holds the files of the base commit itself (its history is scrubbed), so the commit an image
is built from is the base commit, never ``environment_setup_commit``.

Every bad instance is one problem, ``line N (instance ID): field: reason``; nothing is written when
any instance is bad unless ``skip_bad``.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pqrl.errors import PqrlError, UsageError
from pqrl.yaml_text import load_yaml
from sandboxes.recipes import RepoRecipe, build_recipe
from sandboxes.repo_source import apply_problem, source_digest
from tasks.repo.grading import graded_paths
from tasks.repo.task import RepoTask, not_node_id, task_id
from tasks.suite import Problem, Suite, SuiteManifest

__all__ = [
    "ImportFailed",
    "ImportProblem",
    "ImportResult",
    "import_swebench",
    "read_instances",
    "read_requirements",
    "suite_name",
]

ENV_ID = "repo-v1"
_HEX = re.compile(r"^[0-9a-f]{7,64}$")
_PART = r"(?!\.+(?:/|$))[A-Za-z0-9_.-]+"  # never "." or "..": a name is a folder under --repos
_REPO = re.compile(rf"^{_PART}(/{_PART})?$")
_IMAGE_FIELDS = ("image_name", "docker_image")  # SWE-smith / SWE-Gym, R2E-Gym
_LISTS = {"FAIL_TO_PASS": "fail_to_pass", "PASS_TO_PASS": "pass_to_pass"}


class ImportProblem(Problem):
    """``line N (instance ID): field: reason`` (``task_id`` holds the dataset's instance id)."""

    NAMED = ""


@dataclass(frozen=True)
class ImportResult:
    suite: Suite
    skipped: list[ImportProblem]
    images_built: dict[str, int]  # image tag -> number of tasks using it


def read_instances(path: str | Path) -> list[tuple[int, Any]]:
    """(line, record) of each instance: JSONL, or one JSON list (its items numbered from 1)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} cannot be read: {e}") from None
    if text.lstrip().startswith(("[", "{")):
        try:  # one JSON list (or one pretty-printed instance); JSONL fails here and is read by line
            whole = json.loads(text)
        except ValueError:
            whole = None
        except RecursionError:
            raise UsageError(f"{path}: nested too deeply to read") from None
        if isinstance(whole, list) and whole:
            return list(enumerate(whole, 1))
        if isinstance(whole, list):  # as an empty file: one message for no instances
            raise UsageError(f"{path} holds no instances")
        if isinstance(whole, dict):
            return [(1, whole)]
    out: list[tuple[int, Any]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            out.append((n, json.loads(raw)))
        except ValueError as e:
            out.append((n, _Unreadable(f"not valid JSON: {e}")))
        except RecursionError:
            out.append((n, _Unreadable("nested too deeply to read")))
    if not out:
        raise UsageError(f"{path} holds no instances")
    return out


@dataclass(frozen=True)
class _Unreadable:
    reason: str


def read_requirements(path: str | Path | None) -> dict[str, tuple[str, ...]]:
    """Per repository (``owner/name`` or ``name``), the pip specs its images get (JSON or YAML)."""
    if path is None:
        return {}
    try:
        data = load_yaml(Path(path).read_text())  # JSON is YAML
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UsageError(f"requirements {path} cannot be read: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UsageError(f"requirements {path}: expected a mapping of repository -> list of pip specs")
    out = {}
    for repo, specs in data.items():
        if not isinstance(specs, list) or not all(isinstance(s, str) and s.strip() for s in specs):
            raise UsageError(f"requirements {path}: {repo}: expected a list of pip specs")
        try:  # the recipe's own rule for a spec (no pip options), before anything is built
            RepoRecipe(name="check", source=".", requirements=tuple(specs))
        except UsageError as e:
            raise UsageError(f"requirements {path}: {repo}: {e}") from None
        out[str(repo)] = tuple(specs)
    return out


def _test_ids(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("a string that is not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"not a list of test ids (got {type(value).__name__})")
    return value


def _find_repo(repos: Path | None, repo: str) -> Path | None:
    if repos is None:
        return None
    name = repo.rsplit("/", 1)[-1]
    for cand in (repo.replace("/", "__"), f"{repo.replace('/', '__')}.git", name, f"{name}.git"):
        if cand and (repos / cand).is_dir():
            return repos / cand
    return None


@dataclass(frozen=True)
class _Pending:
    line: int
    fields: dict[str, Any]
    recipe: RepoRecipe | None  # None: the instance names its own image


def _convert(
    n: int, record: Any, repos: Path | None, requirements: dict[str, tuple[str, ...]]
) -> tuple[_Pending | None, list[ImportProblem]]:
    if isinstance(record, _Unreadable):
        return None, [ImportProblem(n, None, "(json)", record.reason)]
    if not isinstance(record, dict):
        return None, [ImportProblem(n, None, "(record)", f"not a JSON object ({type(record).__name__})")]
    iid = record.get("instance_id")
    shown = iid if isinstance(iid, str) and iid else None
    problems: list[ImportProblem] = []

    def bad(field: str, reason: str) -> None:
        problems.append(ImportProblem(n, shown, field, reason))

    for field in ("instance_id", "repo", "base_commit", "problem_statement", "test_patch"):
        value = record.get(field)
        if not isinstance(value, str) or not value.strip():
            bad(field, "missing" if value is None else "must be a non-empty string")
    fields: dict[str, Any] = {}
    for src, dest in _LISTS.items():
        if src not in record and src == "PASS_TO_PASS":
            continue
        try:
            fields[dest] = _test_ids(record.get(src))
        except ValueError as e:
            bad(src, "missing" if src not in record else str(e))
            continue
        why = next(filter(None, map(not_node_id, fields[dest])), None)  # the import runs pytest
        if why:
            bad(src, why)
    commit = record.get("base_commit")
    commit = commit.strip().lower() if isinstance(commit, str) else commit  # git reads either case
    if isinstance(commit, str) and commit and not _HEX.match(commit):
        bad("base_commit", f"{commit[:80]!r} is not a hexadecimal commit hash (7 to 64 digits)")
    repo = record.get("repo")
    if isinstance(repo, str) and repo and not _REPO.match(repo):
        bad("repo", f"{repo[:80]!r} is not owner/name")
    image = next((record[f] for f in _IMAGE_FIELDS if isinstance(record.get(f), str) and record[f]), None)
    recipe = None
    if not problems and image is None:
        assert isinstance(repo, str) and isinstance(commit, str)
        source = _find_repo(repos, repo)
        if source is None:
            where = (
                f"no {repo.replace('/', '__')} or {repo.rsplit('/', 1)[-1]} in {repos}"
                if repos
                else ("no image_name and no --repos DIR to build one from")
            )
            bad("repo", f"unknown repository: {where}")
        else:
            try:  # the full commit, so an abbreviated one shares its image; a missing one is a problem
                commit = _resolved(str(source), commit)
            except PqrlError as e:
                bad("base_commit", str(e))
            reqs = requirements.get(repo, requirements.get(repo.rsplit("/", 1)[-1], ()))
            recipe = RepoRecipe(name=repo.replace("/", "__"), source=str(source), base_commit=commit,
                                requirements=reqs, install="editable")  # fmt: skip
    if problems:
        return None, problems
    assert isinstance(iid, str)
    fields.update(
        kind="repo", id=task_id(iid), instance_id=iid, repo=repo, base_commit=commit,
        problem_statement=record["problem_statement"], patch=record.get("patch") or None,
        test_patch=record["test_patch"], image=image or "(built)",
    )  # fmt: skip
    try:
        task = RepoTask.model_validate(fields)
    except ValidationError as e:
        return None, [ImportProblem(n, shown, _source_name(err["loc"]), err["msg"]) for err in e.errors()]
    clone = recipe.source if recipe is not None else _clone_with(repos, task)
    if clone is not None:  # the clone is at hand: a patch that does not apply is refused now
        field, why = _apply_problem(clone, task)
        if why:
            return None, [ImportProblem(n, shown, field, why)]
    return _Pending(n, fields, recipe), []


def _clone_with(repos: Path | None, task: RepoTask) -> str | None:
    """The clone under ``repos`` of an instance that names its own image, if it holds the base commit."""
    source = _find_repo(repos, task.repo)
    try:
        return str(source) if source is not None and _resolved(str(source), task.base_commit) else None
    except PqrlError:  # the image is the instance's own: a clone without the commit is no problem
        return None


def _apply_problem(source: str, task: RepoTask) -> tuple[str, str | None]:
    """(field, why) when the gold patch (less the paths the grader owns, as grading applies it) or
    then the test patch does not apply to the base commit in the clone."""
    patches: list[tuple[str, str, Sequence[str]]] = [("the test patch", task.test_patch, ())]
    if task.patch:
        patches.insert(0, ("the gold patch", task.patch, graded_paths(task)))
    why = apply_problem(source, task.base_commit, patches)
    return ("patch" if why and why.startswith("the gold") else "test_patch"), why


@functools.lru_cache(maxsize=4096)
def _resolved(source: str, commit: str) -> str:
    """The full commit (one git call per clone and commit, however many instances share it)."""
    return source_digest(source, commit).removeprefix("git:")


def _source_name(loc: tuple[Any, ...]) -> str:
    first = str(loc[0]) if loc else "(record)"
    name = {v: k for k, v in _LISTS.items()}.get(first, first)
    return ".".join([name, *(str(x) for x in loc[1:])])


def import_swebench(
    path: str | Path,
    *,
    name: str,
    repos: str | Path | None = None,
    requirements: str | Path | None = None,
    skip_bad: bool = False,
    verdict: str | None = None,
    progress: Callable[[str], None] = print,
    build: Callable[..., str] = build_recipe,
) -> ImportResult:
    """The suite of the instances in ``path`` (images built first). Raises UsageError listing
    every problem unless ``skip_bad`` (then the skipped instances are the result's ``skipped``).
    ``verdict`` ("values" or "junit"): repo-v1's grading, written to the suite's ``defaults``."""
    try:
        SuiteManifest(name=name, version="1", env_id=ENV_ID, kind="repo", reward="env")
    except ValidationError:
        raise UsageError(f"suite name {name!r} is not a lower-case slug", fix="pass --name") from None
    repos_dir = Path(repos) if repos is not None else None
    if repos_dir is not None and not repos_dir.is_dir():
        raise UsageError(f"--repos {repos} is not a directory")
    if verdict not in (None, "values", "junit"):
        raise UsageError(f"verdict {verdict!r} is neither values nor junit")
    reqs = read_requirements(requirements)
    pending: list[_Pending] = []
    problems: list[ImportProblem] = []
    seen: dict[str, int] = {}
    records = read_instances(path)
    _unused_requirements(reqs, records, progress)
    for n, record in records:
        got, found = _convert(n, record, repos_dir, reqs)
        if got is not None and got.fields["id"] in seen:
            iid = got.fields["instance_id"]
            found = [ImportProblem(n, iid, "instance_id", f"same task id as line {seen[got.fields['id']]}")]
            got = None
        problems += found
        if got is not None:
            seen[got.fields["id"]] = n
            pending.append(got)
    if problems and not skip_bad:
        raise ImportFailed(problems)
    if not pending:
        raise ImportFailed(problems or [ImportProblem(0, None, "(file)", "no instances")])
    images, failed = _build_images(pending, build, progress)
    for p in pending:  # an image that cannot be built fails the instances that need it
        if p.recipe in failed:
            iid = p.fields["instance_id"]
            problems.append(ImportProblem(p.line, iid, "image", f"building it failed: {failed[p.recipe]}"))
    pending = [p for p in pending if p.recipe not in failed]
    if failed and (not skip_bad or not pending):
        raise ImportFailed(problems)
    tasks = []
    used: dict[str, int] = {}
    for p in pending:
        image = images[p.recipe] if p.recipe is not None else p.fields["image"]
        used[image] = used.get(image, 0) + 1
        tasks.append(RepoTask.model_validate({**p.fields, "image": image}))
    about = f"imported from {Path(path).name} ({len(tasks)} instances)"
    defaults = {"verdict": verdict} if verdict else {}
    manifest = SuiteManifest(
        name=name, version="1", env_id=ENV_ID, kind="repo", reward="env", description=about, defaults=defaults
    )
    return ImportResult(Suite(manifest, tuple(tasks)), problems, used)


def _unused_requirements(
    reqs: dict[str, tuple[str, ...]], records: list[tuple[int, Any]], progress: Callable[[str], None]
) -> None:
    """Requirements keys no instance's ``repo`` names (``owner/name`` or ``name``). One close to a
    repository that has no requirements is a typo that would leave its image without its
    packages: refused. The others are a shared file's entries for repositories not imported here:
    said, and left alone."""
    named = {r["repo"] for _, r in records if isinstance(r, dict) and isinstance(r.get("repo"), str)}
    known = named | {repo.rsplit("/", 1)[-1] for repo in named}
    unused = [key for key in reqs if key not in known]
    bare = sorted(r for r in named if r not in reqs and r.rsplit("/", 1)[-1] not in reqs)
    for key in unused:
        near = difflib.get_close_matches(key, bare, n=1, cutoff=0.8)
        if near:
            raise UsageError(
                f"requirements for {key}: no instance names this repository; {near[0]} has none",
                fix=f"key it {near[0]}",
            )
    if unused:
        progress(f"requirements for {len(unused)} repositories no instance here names, not used: "
                 f"{', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''}")  # fmt: skip


def suite_name(output: str | Path) -> str:
    """A suite name from the output file's name."""
    return re.sub(r"[^a-z0-9_.-]+", "-", Path(output).stem.lower()).strip("-.")[:64] or "imported"


def _build_images(
    pending: list[_Pending], build: Callable[..., str], progress: Callable[[str], None]
) -> tuple[dict[RepoRecipe | None, str], dict[RepoRecipe | None, str]]:
    """(recipe -> image tag, recipe -> why its build failed)."""
    recipes = list(dict.fromkeys(p.recipe for p in pending if p.recipe is not None))
    images: dict[RepoRecipe | None, str] = {}
    failed: dict[RepoRecipe | None, str] = {}
    for i, recipe in enumerate(recipes, 1):
        progress(f"image {i}/{len(recipes)}: {recipe.name} at {recipe.base_commit}")
        try:
            images[recipe] = build(recipe, progress=progress)
        except PqrlError as e:  # a requirement pip cannot install, a failed docker build
            failed[recipe] = e.line()
            progress(f"image {i}/{len(recipes)}: failed: {e.line()}")
    return images, failed


class ImportFailed(UsageError):
    """Every bad instance, one per line; the error's line sums them up."""

    def __init__(self, problems: list[ImportProblem]) -> None:
        super().__init__(f"{len(problems)} problem(s) in the instances; nothing written")
        self.problems = problems
