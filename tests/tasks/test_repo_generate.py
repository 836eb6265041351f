"""``pqrl tasks generate coding --from-repo`` for real: a small project written here, its tests run
in sandboxes of images built by docker, bugs kept by their failing tests, and the suite checked by
``pqrl tasks validate --check`` (gold 1, empty 0). The fix must be nowhere in the agent's sandbox:
not in its files, not in git's objects, not in site-packages."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxes.docker import DockerSandbox, owner_id
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from tasks.repo.task import RepoTask
from tasks.suite import load_suite

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]

OPS = '''"""Small numeric helpers."""


def clamp(tc_value, tc_low, tc_high):
    if tc_value < tc_low:
        return tc_low
    if tc_value > tc_high:
        return tc_high
    return tc_value


def mean_of(tc_values):
    tc_total = sum(tc_values)
    return tc_total / len(tc_values)


def count_positive(tc_items):
    tc_positive = 0
    for tc_item in tc_items:
        if tc_item > 0:
            tc_positive += 1
    return tc_positive
'''
WORDS = """def shout(word):
    return word.upper() + "!"
"""
TEST_OPS = """from tinycalc.ops import clamp, count_positive, mean_of


class TestClamp:
    def test_inside(self):
        assert clamp(5, 0, 10) == 5

    def test_low(self):
        assert clamp(-3, 0, 10) == 0

    def test_high(self):
        assert clamp(30, 0, 10) == 10


def test_mean():
    assert mean_of([1, 2, 3, 6]) == 3


def test_count_positive():
    assert count_positive([1, -2, 3, 0]) == 2
"""
# test_shout checks without an assert: only its outcome could judge it, and code under test can
# forge an outcome, so the check drops shout's bug (its one mutation) and generation goes on
TEST_WORDS = """from tinycalc.words import shout


def test_shout():
    if shout("hi") != "HI!":
        raise AssertionError("not shouted")


def test_name():
    assert shout.__name__ == "shout"
"""


def _project(root: Path) -> Path:
    files = {
        "pyproject.toml": '[project]\nname = "tinycalc"\nversion = "0.1.0"\n',
        "tinycalc/__init__.py": "",
        "tinycalc/ops.py": OPS,
        "tinycalc/words.py": WORDS,
        "tests/test_ops.py": TEST_OPS,
        "tests/test_words.py": TEST_WORDS,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _pqrl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "launcher.cli", "tasks", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=280, env=env)


async def _visible(image: str, needles: list[str]) -> str:
    """What the agent's sandbox of ``image`` shows of ``needles``: its files anywhere (site-packages
    too) after repo-v1's copy to /workspace, and every object in /repo's git."""
    api = DockerAPI()
    try:
        async with await DockerSandbox.create(
            api, SandboxSettings(image=image), run="pytest-repo-generate"
        ) as box:
            await box.exec(["sh", "-c", "cp -a /repo/. /workspace"], timeout=60)
            patterns = [a for n in needles for a in ("-e", n)]
            skip = ["--exclude-dir=proc", "--exclude-dir=sys", "--exclude-dir=dev"]
            grep = await box.exec(["grep", "-rlF", *skip, *patterns, "/"], timeout=120)
            # what the agent's uid cannot read it cannot read either; any other complaint fails
            errors = [e for e in grep.stderr.decode().splitlines() if not e.endswith("Permission denied")]
            assert grep.exit_code in (0, 1, 2) and not errors, grep.text()
            found = grep.stdout.decode().split()
            for git in ("/repo", "/workspace"):
                objects = await box.exec(["sh", "-c", f"git -C {git} cat-file --batch-all-objects --batch"])
                assert objects.ok and b"tinycalc" in objects.stdout, objects.text()[-300:]
                found += [f"{git} git objects" for n in needles if n.encode() in objects.stdout]
            return "; ".join(found)
    finally:
        await api.close()


def test_generate_from_a_local_project_gives_tasks_gold_fixes_and_the_fix_is_hidden(tmp_path):
    project = _project(tmp_path / "tinycalc")
    env = {**os.environ, "PQRL_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "suite.jsonl"
    args = (
        "generate",
        "coding",
        "--from-repo",
        str(project),
        "--out",
        str(out),
        "--max-tasks",
        "4",
        "--seed",
        "1",
    )
    r = _pqrl(env, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "baseline run 2: 7 of 7 tests pass" in r.stderr and "mutants tried" in r.stderr
    # four functions, one bug each at most: shout's fails the check, the three of ops.py pass it
    dropped = [ln for ln in r.stderr.splitlines() if ln.startswith("dropped ")]
    assert len(dropped) == 1 and "tinycalc/words.py:shout:" in dropped[0], r.stderr
    assert "cannot judge safely" in dropped[0] and "tests/test_words.py::test_shout" in dropped[0]
    assert "3 tasks" in r.stdout and "1 dropped by the check" in r.stdout, r.stdout
    suite = load_suite(out)
    tasks = [t for t in suite.tasks if isinstance(t, RepoTask)]
    assert suite.manifest.env_id == "repo-v1" and len(tasks) == 3
    assert [t.id for t in tasks] == ["tinycalc-000", "tinycalc-001", "tinycalc-002"]
    try:
        for task in tasks:
            # ops.py's bugs run only tests/test_ops.py: test_words.py does not import ops
            files = {t.split("::", 1)[0] for t in [*task.fail_to_pass, *task.pass_to_pass]}
            assert files == {"tests/test_ops.py"}, task.id
            assert task.test_patch.startswith("diff --git a/tests/test_ops.py b/tests/test_ops.py\nnew file")
            plus = [
                ln[1:].strip() for ln in task.patch.splitlines() if ln.startswith("+") and ln[:3] != "+++"
            ]
            clean = [c for c in plus if "tc_" in c]  # names found nowhere else: a hit is the fix
            assert clean, task.patch
            assert asyncio.run(_visible(task.image, clean)) == "", task.patch
        # gold 1, empty 0 (the buggy tree fails FAIL_TO_PASS) in repo-v1's own sandboxes
        r = _pqrl(env, "validate", str(out), "--check", "--jobs", "2")
        assert r.returncode == 0 and "all 3 task(s) pass --check" in r.stdout, r.stdout + r.stderr
        # a rerun runs no test again, checks no task again, builds no image, and writes the same suite
        again = tmp_path / "again.jsonl"
        r = _pqrl(env, *args[:5], str(again), *args[6:])
        assert r.returncode == 0 and "docker build" not in r.stderr, r.stderr
        assert "[check " not in r.stderr and "1 dropped by the check" in r.stdout, r.stderr
        tried = json.loads(out.read_text().splitlines()[0])
        assert again.read_text() == out.read_text(), tried
        assert "from cache" in r.stdout and " 0 from cache" not in r.stdout, r.stdout
    finally:
        images = {t.image for t in tasks}
        subprocess.run(["docker", "rmi", "-f", *images], capture_output=True)


def test_bad_sources_are_one_line_usage_errors(tmp_path):
    env = {**os.environ, "PQRL_CACHE": str(tmp_path / "cache")}
    out = str(tmp_path / "s.jsonl")
    r = _pqrl(env, "generate", "coding", "--from-sdist", "not a spec", "--out", out)
    assert r.returncode == 2 and "is not NAME==VERSION" in r.stderr, r.stderr
    r = _pqrl(env, "generate", "calc", "--from-repo", str(tmp_path), "--out", out)
    assert r.returncode == 2 and "make coding tasks" in r.stderr, r.stderr
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "mod.py").write_text("def f():\n    return 1\n")
    r = _pqrl(env, "generate", "coding", "--from-repo", str(tmp_path / "empty"), "--out", out)
    assert r.returncode == 2 and "ships no test files" in r.stderr, r.stderr
    # every test fails on the clean tree (here: a module the sandbox lacks): the cause, and what to do
    (tmp_path / "empty" / "test_mod.py").write_text(
        "import mod\n\n\ndef test_f():\n    import pqrl_absent_module\n\n    assert mod.f() == 1\n"
    )
    r = _pqrl(env, "generate", "coding", "--from-repo", str(tmp_path / "empty"), "--out", out)
    assert r.returncode == 2 and "no test passes on the clean tree" in r.stderr, r.stderr
    assert "test_mod.py::test_f" in r.stderr and "No module named 'pqrl_absent_module'" in r.stderr
    assert "--requirements" in r.stderr, r.stderr
    assert not Path(out).exists()


def test_a_sandbox_a_run_left_unusable_is_replaced_not_reused(tmp_path, monkeypatch):
    from tasks.repo.generate import _images, _Runner
    from tasks.repo.project import load_project

    monkeypatch.setenv("PQRL_CACHE", str(tmp_path / "cache"))
    project = load_project(_project(tmp_path / "src"), "tinycalc", "tinycalc", tmp_path / "tree")
    _, clean = _images(project, (), lambda m: None)

    async def go() -> tuple[bool, dict | None, list]:
        async with _Runner(clean, 1, 60) as runner:
            first = runner.boxes.get_nowait()
            # what a mutant's test may leave: a folder its own user cannot empty
            await first.exec(["sh", "-c", "mkdir -p /workspace/stuck/in && chmod 000 /workspace/stuck"])
            runner.boxes.put_nowait(first)
            got, _ = await runner.run(["tests/test_ops.py"], {}, 60)
            now = runner.boxes.get_nowait()
            runner.boxes.put_nowait(now)
            replaced = now is not first and not first.alive
        api = DockerAPI()
        try:
            left = await api.list({"pqrl.run": "pqrl-generate", "pqrl.owner": owner_id()})
        finally:
            await api.close()
        return replaced, got, left

    replaced, got, left = asyncio.run(go())
    assert replaced and got is not None and len(got) == 5, got
    assert {o.outcome for o in got.values()} == {"passed"}
    assert left == []


def test_an_sdist_is_named_by_the_index_filename_rules():
    """The file the simple API lists for NAME==VERSION: PEP 503 names, either separator, no wheel."""
    from tasks.repo.project import _is_sdist_of

    assert _is_sdist_of("more_itertools-10.5.0.tar.gz", "more-itertools", "10.5.0")
    assert _is_sdist_of("Toolz-0.12.1.zip", "toolz", "0.12.1")
    assert not _is_sdist_of("toolz-0.12.1-py3-none-any.whl", "toolz", "0.12.1")
    assert not _is_sdist_of("toolz-0.12.10.tar.gz", "toolz", "0.12.1")
    assert not _is_sdist_of("toolzx-0.12.1.tar.gz", "toolz", "0.12.1")
