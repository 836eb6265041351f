"""``pqrl tasks import swebench`` for real: instances in the field shapes the datasets use (test ids
as JSON-encoded strings and as lists, an image named and not), a local git repository made here,
an image built by docker once per repository version, and bad instances reported as
``line N (instance): field: reason`` with nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from env_server.registry import registry
from tasks.repo.task import RepoTask
from tasks.suite import SuiteManifest, load_suite
from tests.sandboxes.test_recipes import _dangling, _git

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def _new_file(path: str, text: str) -> str:
    """A unified diff that creates ``path`` holding ``text``."""
    lines = text.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    head = f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
    return f"{head}@@ -0,0 +1,{len(lines)} @@\n{body}"


_TESTS = _new_file(
    "tests/test_calc.py",
    "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n\ndef test_add_zero():\n"
    "    assert add(0, 0) == 0\n",
)


GOLD = _new_file("NOTES.md", "fixed\n")  # applies at any commit of the fixture's repositories


def _pqrl(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "launcher.cli", "tasks", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, env=dict(os.environ))


@pytest.fixture
def repos(tmp_path: Path) -> Iterator[dict[str, str]]:
    """DIR/owner__calc: two commits (base, then the fix); the images built from it are removed after."""
    root = tmp_path / "repos"
    repo = root / "owner__calc"
    repo.mkdir(parents=True)
    (repo / "calc.py").write_text(
        f"# {uuid.uuid4().hex}\ndef add(a, b):\n    return a - b\n"
    )  # a fresh image
    _git(root, "init", "-q", "-b", "main", "owner__calc")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    _git(repo, "commit", "-qam", "fix")
    _git(root, "clone", "-q", "--mirror", str(repo), "calc2.git")  # DIR/name.git: a bare mirror
    before = _dangling()
    yield {"dir": str(root), "base": base, "fix": _git(repo, "rev-parse", "HEAD")}
    r = subprocess.run(["docker", "images", "-q", "--filter", "reference=pqrl-repo-owner-calc*"],
                       capture_output=True, text=True)  # fmt: skip
    for image in set(r.stdout.split()):
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)
    # Only this test's recipes count: other builds on a shared engine may leave their own.
    ours = subprocess.run(["docker", "images", "-q", "-f", "dangling=true", "-f", "label=pqrl.recipe"],
                          capture_output=True, text=True).stdout.split()  # fmt: skip
    assert set(ours) <= before, "the import left dangling images"


def _instance(iid: str, commit: str | None, **over: object) -> dict[str, object]:
    record: dict[str, object] = {
        "instance_id": iid, "repo": "owner/calc", "base_commit": commit, "version": "1.0",
        "environment_setup_commit": commit, "problem_statement": "add(2, 3) returns -1",
        "patch": GOLD, "test_patch": _TESTS,
        "FAIL_TO_PASS": '["tests/test_calc.py::test_add"]', "PASS_TO_PASS": "[]",
        "created_at": "2024-01-01T00:00:00Z", "hints_text": "",
    }  # fmt: skip
    if commit is None:
        del record["base_commit"]
    record.update(over)
    return record


def _write(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_import_builds_one_image_per_repository_version_and_the_suite_validates(repos, tmp_path):
    base = repos["base"]
    instances = _write(tmp_path / "instances.jsonl", [
        _instance("owner__calc-1", base),
        _instance("owner__calc-2", base[:12], FAIL_TO_PASS=["tests/test_calc.py::test_add"],
                  PASS_TO_PASS=["tests/test_calc.py::test_sub"]),
        _instance("Other__Thing-7", "a" * 40, repo="other/thing", image_name="swesmith.other__thing.aa"),
        _instance("owner__calc2-1", base, repo="owner/calc2"),
    ])  # fmt: skip
    out = tmp_path / "calc-suite.jsonl"
    r = _pqrl("import", "swebench", str(instances), "-o", str(out), "--repos", repos["dir"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr.count("docker build ->") == 2, r.stderr  # one per repository version
    assert "image 1/2: owner__calc at" in r.stderr and "image 2/2: owner__calc2 at" in r.stderr, r.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    manifest = SuiteManifest.model_validate(lines[0]["suite"])
    assert (manifest.name, manifest.kind, manifest.env_id) == ("calc-suite", "repo", "repo-v1")
    tasks = [RepoTask.model_validate(x) for x in lines[1:]]
    assert [t.id for t in tasks] == ["owner__calc-1", "owner__calc-2", "other__thing-7", "owner__calc2-1"]
    assert tasks[3].image.startswith("pqrl-repo-owner-calc2:")
    assert tasks[0].image == tasks[1].image and tasks[0].image.startswith("pqrl-repo-owner-calc:")
    assert tasks[2].image == "swesmith.other__thing.aa"
    assert tasks[1].base_commit == base  # resolved in the clone
    assert tasks[0].fail_to_pass == ["tests/test_calc.py::test_add"] and tasks[0].pass_to_pass == []
    assert tasks[1].pass_to_pass == ["tests/test_calc.py::test_sub"]
    assert subprocess.run(["docker", "image", "inspect", tasks[0].image], capture_output=True).returncode == 0
    if "repo-v1" in registry():  # the environment registered: the suite loads as any other
        assert len(load_suite(out).tasks) == 4
    # Again: the image is found, not rebuilt; a JSON list reads like JSONL.
    listed = tmp_path / "instances.json"
    listed.write_text(json.dumps([json.loads(x) for x in instances.read_text().splitlines()]))
    again = _pqrl(
        "import", "swebench", str(listed), "-o", str(tmp_path / "again.jsonl"), "--repos", repos["dir"]
    )
    assert again.returncode == 0 and "docker build" not in again.stderr and "is present" in again.stderr

    bad = _write(tmp_path / "bad.jsonl", [
        _instance("owner__calc-1", base),
        _instance("owner__calc-3", None),
        _instance("owner__nowhere-1", base, repo="owner/nowhere"),
        _instance("owner__calc-4", "zz" + base[2:]),
        _instance("owner__calc-5", base, FAIL_TO_PASS='"tests/test_calc.py::test_add"'),
        _instance("owner__calc-6", "f" * 40),
    ])  # fmt: skip
    failed = tmp_path / "failed.jsonl"
    r = _pqrl("import", "swebench", str(bad), "-o", str(failed), "--repos", repos["dir"])
    assert r.returncode == 2 and "Traceback" not in r.stderr and not failed.exists(), r.stdout + r.stderr
    problems = r.stdout.splitlines()
    assert problems[0] == "line 2 (owner__calc-3): base_commit: missing", problems
    assert problems[1].startswith("line 3 (owner__nowhere-1): repo: unknown repository"), problems
    assert problems[2].startswith("line 4 (owner__calc-4): base_commit: ") and "hexadecimal" in problems[2]
    assert problems[3].startswith("line 5 (owner__calc-5): FAIL_TO_PASS: not a list"), problems
    assert problems[4].startswith("line 6 (owner__calc-6): base_commit: ") and "not" in problems[4], problems
    assert len(problems) == 5 and "5 problem(s)" in r.stderr
    # --skip-bad writes the good one and lists the rest.
    r = _pqrl("import", "swebench", str(bad), "-o", str(failed), "--repos", repos["dir"], "--skip-bad")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sum(x.startswith("skipped line ") for x in r.stdout.splitlines()) == 5
    assert [json.loads(x)["id"] for x in failed.read_text().splitlines()[1:]] == ["owner__calc-1"]


def test_an_instance_without_image_or_repos_is_a_problem(tmp_path):
    src = _write(tmp_path / "one.jsonl", [_instance("a-1", "b" * 40), {"instance_id": 3}, ["x"]])
    r = _pqrl("import", "swebench", str(src), "-o", str(tmp_path / "o.jsonl"))
    assert r.returncode == 2 and not (tmp_path / "o.jsonl").exists()
    out = r.stdout.splitlines()
    assert (
        out[0] == "line 1 (a-1): repo: unknown repository: no image_name and no --repos DIR to build one from"
    )
    assert (
        "line 2: instance_id: must be a non-empty string" in out
        and "line 3: (record): not a JSON object (list)" in out
    )


def test_names_that_leave_the_repos_folder_and_bad_requirements_are_refused(repos, tmp_path):
    outside = _write(tmp_path / "dots.jsonl", [
        _instance("up-1", repos["base"], repo="owner/.."),
        _instance("up-2", repos["base"], repo=".."),
        _instance("caps-1", repos["base"].upper(), image_name="some/image:1"),
    ])  # fmt: skip
    r = _pqrl("import", "swebench", str(outside), "-o", str(tmp_path / "o.jsonl"), "--repos", repos["dir"])
    assert r.returncode == 2 and not (tmp_path / "o.jsonl").exists(), r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "line 1 (up-1): repo: 'owner/..' is not owner/name",
        "line 2 (up-2): repo: '..' is not owner/name",
    ]
    reqs = tmp_path / "reqs.yaml"
    reqs.write_text("owner/calc:\n  - --index-url=http://example.invalid\n")
    one = _write(tmp_path / "one.jsonl", [_instance("calc-1", repos["base"])])
    r = _pqrl("import", "swebench", str(one), "-o", str(tmp_path / "o.jsonl"), "--repos", repos["dir"],
              "--requirements", str(reqs))  # fmt: skip
    assert r.returncode == 2 and "not a pip spec" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "docker build" not in r.stderr and not (tmp_path / "o.jsonl").exists()
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(_instance("caps-1", repos["base"].upper(), image_name="img:1"), indent=2))
    r = _pqrl("import", "swebench", str(pretty), "-o", str(tmp_path / "o.jsonl"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((tmp_path / "o.jsonl").read_text().splitlines()[1])["base_commit"] == repos["base"]


def test_an_image_that_cannot_be_built_fails_its_instances_only(repos, tmp_path):
    reqs = tmp_path / "reqs.json"
    reqs.write_text(json.dumps({"calc": ["pqrl-no-such-package-4f1c9a==0.0.1"]}))
    src = _write(
        tmp_path / "two.jsonl",
        [_instance("calc-1", repos["base"]), _instance("img-1", "c" * 40, image_name="x:1")],
    )
    args = [
        "import",
        "swebench",
        str(src),
        "-o",
        str(tmp_path / "o.jsonl"),
        "--repos",
        repos["dir"],
        "--requirements",
        str(reqs),
    ]
    r = _pqrl(*args)
    assert r.returncode == 2 and not (tmp_path / "o.jsonl").exists() and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.startswith("line 1 (calc-1): image: building it failed: "), r.stdout
    r = _pqrl(*args, "--skip-bad")
    assert r.returncode == 0 and r.stdout.startswith("skipped line 1 (calc-1): image: "), r.stdout + r.stderr
    assert [json.loads(x)["id"] for x in (tmp_path / "o.jsonl").read_text().splitlines()[1:]] == ["img-1"]


def test_imported_instances_grade_gold_1_and_empty_0_and_a_gold_that_fixes_nothing_is_named(repos, tmp_path):
    """SWE-bench-format instances from the clone, imported, then every task's gold patch and an
    empty episode graded by repo-v1 in real sandboxes (``tasks validate --check``)."""
    clone = Path(repos["dir"]) / "owner__calc"
    gold = _git(clone, "diff", repos["base"], repos["fix"]) + "\n"
    noop = gold.replace("+    return a + b", "+    return a - b")  # changes the comment line only
    common = {"FAIL_TO_PASS": '["tests/test_calc.py::test_add"]',
              "PASS_TO_PASS": '["tests/test_calc.py::test_add_zero"]', "test_patch": _TESTS}  # fmt: skip
    good = _write(tmp_path / "good.jsonl", [
        _instance("owner__calc-1", repos["base"], patch=gold, **common),
        _instance("owner__calc-2", repos["base"], patch=gold, problem_statement="add is wrong", **common),
    ])  # fmt: skip
    out = tmp_path / "calc-real.jsonl"
    r = _pqrl("import", "swebench", str(good), "-o", str(out), "--repos", repos["dir"])
    assert r.returncode == 0, r.stdout + r.stderr
    r = _pqrl("validate", str(out), "--check", "--jobs", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all 2 task(s) pass --check" in r.stdout and "owner__calc-1: ok" in r.stderr, r.stdout + r.stderr

    bad = _write(tmp_path / "bad.jsonl", [
        _instance("owner__calc-1", repos["base"], patch=gold, **common),
        _instance("owner__calc-9", repos["base"], patch=noop, **common),
    ])  # fmt: skip
    out = tmp_path / "calc-bad.jsonl"
    r = _pqrl("import", "swebench", str(bad), "-o", str(out), "--repos", repos["dir"])
    assert r.returncode == 0, r.stdout + r.stderr
    r = _pqrl("validate", str(out), "--check", "--jobs", "2")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "owner__calc-9" in r.stdout + r.stderr and "owner__calc-1" not in r.stdout, r.stdout + r.stderr


def test_what_repo_v1_cannot_grade_is_refused_at_import_with_the_reason(repos, tmp_path):
    """With the clone at hand: a gold or test patch that does not apply to the base commit (git's own
    error), test ids that are not pytest node ids (unittest's style), a requirements key no instance
    names; an empty JSON list reads as an empty file; --verdict writes the suite's default."""
    base, clone = repos["base"], Path(repos["dir"]) / "owner__calc"
    gold = _git(clone, "diff", base, repos["fix"]) + "\n"
    stale = gold.replace(" def add(a, b):", " def add(x, y):")  # a wrong context line
    elsewhere = gold.replace("calc.py", "tests/test_calc.py")  # changes a file the base lacks
    src = _write(tmp_path / "bad.jsonl", [
        _instance("calc-1", base, patch=stale),
        _instance("calc-2", base, patch=gold, test_patch=elsewhere),
        _instance("calc-3", base, patch=gold, FAIL_TO_PASS=["test_add (tests.test_calc.TestCalc)"]),
        _instance("calc-4", base, patch=gold, PASS_TO_PASS='["test_add"]'),
        _instance("calc-5", base, patch=gold),
        _instance("calc-6", base, patch=stale, image_name="x:1"),  # its own image, the clone at hand
    ])  # fmt: skip
    out = tmp_path / "o.jsonl"
    r = _pqrl("import", "swebench", str(src), "-o", str(out), "--repos", repos["dir"])
    assert r.returncode == 2 and not out.exists() and "Traceback" not in r.stderr, r.stdout + r.stderr
    problems = r.stdout.splitlines()
    assert problems[0] == f"line 1 (calc-1): patch: the gold patch does not apply to {base[:12]}: " + (
        "error: patch failed: calc.py:1"
    ), problems
    assert problems[1].startswith(
        f"line 2 (calc-2): test_patch: the test patch does not apply to {base[:12]}"
    )
    assert "error: tests/test_calc.py" in problems[1], problems
    assert problems[2].startswith(
        "line 3 (calc-3): FAIL_TO_PASS: test id 'test_add (tests.test_calc.TestCalc)'"
    )
    assert "needs ids path::name" in problems[2] and problems[3].startswith("line 4 (calc-4): PASS_TO_PASS:")
    assert problems[4].startswith("line 6 (calc-6): patch: the gold patch does not apply"), problems
    assert len(problems) == 5 and "docker build" not in r.stderr, problems

    reqs = tmp_path / "reqs.yaml"
    reqs.write_text("owner/cacl:\n  - six\nother/repo:\n  - six\n")  # a typo of owner/calc
    r = _pqrl(
        "import", "swebench", str(src), "-o", str(out), "--repos", repos["dir"], "--requirements", str(reqs)
    )
    assert r.returncode == 2 and not out.exists(), r.stdout + r.stderr
    assert "requirements for owner/cacl: no instance names this repository; owner/calc" in r.stderr

    for empty in ("", "[]", "  [ ]\n"):
        (tmp_path / "empty.json").write_text(empty)
        r = _pqrl("import", "swebench", str(tmp_path / "empty.json"), "-o", str(out))
        assert r.returncode == 2 and "holds no instances" in r.stderr and "line 0" not in r.stdout, r.stderr

    named = _write(tmp_path / "img.jsonl", [_instance("img-1", "c" * 40, image_name="x:1")])
    r = _pqrl("import", "swebench", str(named), "-o", str(out), "--verdict", "junit")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(out.read_text().splitlines()[0])["suite"]["defaults"] == {"verdict": "junit"}
