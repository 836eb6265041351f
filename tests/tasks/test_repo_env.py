"""repo-v1 end to end with real Docker: a small git repository built into an image by a recipe,
sessions of that image, the agent's diff graded by the hidden test patch in a fresh container."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from env_server.conformance import check_environment
from env_server.sessions import BadTask, SessionManager
from env_server.types import ToolCall
from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from sandboxes.recipes import RepoRecipe, build_recipe
from sandboxes.repo_source import glob_literal
from tasks.repo.env import RepoEnv
from tasks.repo.grading import _numstat_paths, grade_patch, graded_paths, hidden_paths
from tasks.repo.task import RepoTask
from tests.tasks.conftest import leftovers

pytestmark = pytest.mark.timeout(600)

RUN = "pytest-repo-env"
MARKER = "HIDDEN_7f3c1e"  # only in the hidden tests
# Fixed identity and dates: the same files give the same commit, so the recipe's image is cached.
_GIT = {
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin",
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_AUTHOR_DATE": "2020-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2020-01-01T00:00:00+0000",
}  # fmt: skip


def _context(patch: str) -> str:
    """A patch written with "." for its blank context lines (a line of one space)."""
    return "\n".join(" " if line == "." else line for line in patch.split("\n"))


_MATH = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n"
_BASIC = "from mathx import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
GOLD = _context("""\
diff --git a/mathx/__init__.py b/mathx/__init__.py
--- a/mathx/__init__.py
+++ b/mathx/__init__.py
@@ -4,3 +4,3 @@ def add(a, b):
.
 def mul(a, b):
-    return a + b
+    return a * b
""")
BREAK_ADD = _context("""\
diff --git a/mathx/__init__.py b/mathx/__init__.py
--- a/mathx/__init__.py
+++ b/mathx/__init__.py
@@ -1,6 +1,6 @@
 def add(a, b):
-    return a + b
+    return a - b
.
.
 def mul(a, b):
-    return a + b
+    return a * b
""")
HIDDEN = f"""\
diff --git a/tests/test_mul.py b/tests/test_mul.py
new file mode 100644
--- /dev/null
+++ b/tests/test_mul.py
@@ -0,0 +1,12 @@
+from mathx import mul
+
+
+def test_mul():
+    assert mul(3, 4) == 12  # {MARKER}
+
+
+class TestMore:
+    def test_square(self):
+        assert mul(5, 5) == 25
+    def test_extra_fails(self):
+        assert False
"""
F2P = ["tests/test_mul.py::test_mul", "tests/test_mul.py::TestMore::test_square"]
P2P = ["tests/test_basic.py::test_add"]


def _git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], env=_GIT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The repository's image (kept between runs: its tag is the recipe's hash)."""
    repo = tmp_path_factory.mktemp("src") / "mathx"
    (repo / "mathx").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "mathx" / "__init__.py").write_text(_MATH)
    (repo / "tests" / "test_basic.py").write_text(_BASIC)
    _git(repo.parent, "init", "-q", "-b", "main", "mathx")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    return build_recipe(
        RepoRecipe(name="pqrl-test-mathx", source=str(repo), base_commit=_git(repo, "rev-parse", "HEAD"))
    )


def make_task(image: str, **fields: Any) -> dict[str, Any]:
    base = dict(
        id="mathx-1", instance_id="pqrl__mathx-1", repo="pqrl/mathx", base_commit="0" * 40,
        problem_statement="mul(3, 4) returns 7 instead of 12.", patch=GOLD, test_patch=HIDDEN,
        fail_to_pass=F2P, pass_to_pass=P2P, test_command="python3 -m pytest -p no:cacheprovider", image=image,
    )  # fmt: skip
    return RepoTask(**{**base, **fields}).model_dump()


async def episode(manager: SessionManager, task: dict[str, Any], calls: list[ToolCall], **kwargs: Any) -> Any:
    s = (
        await manager.create("repo-v1", task, env_kwargs=kwargs)
        if kwargs
        else await manager.create("repo-v1", task)
    )
    try:
        for call in calls:
            await manager.step(s.session_id, [call])
        return await manager.evaluate(s.session_id)
    finally:
        await manager.close(s.session_id)


def run(command: str) -> ToolCall:
    return ToolCall(name="run", arguments={"command": command}, id="r")


@pytest.fixture
async def grade(image: str) -> AsyncIterator[Any]:
    """Grades a patch directly in fresh sandboxes of the image, labelled with RUN."""
    api = DockerAPI()

    async def make() -> DockerSandbox:
        return await DockerSandbox.create(api, SandboxSettings(image=image), run=RUN)

    async def graded(task: dict[str, Any], patch: bytes, timeout: float = 60.0) -> Any:
        return await grade_patch(RepoTask(**task), patch, make, timeout=timeout)

    yield graded
    left = await leftovers(api, RUN)
    await api.close()
    assert left == []


async def test_the_worked_example_earns_1_and_the_empty_episode_0(manager, image):
    task = make_task(image)
    gold = await episode(manager, task, RepoEnv.worked_example(task) or [])
    assert gold.reward == 1.0, gold.info
    assert gold.info["failed_tests"] == {} and gold.info["missing_tests"] == []  # test_extra_fails ignored
    empty = await episode(manager, task, [])
    assert empty.reward == 0.0
    assert set(empty.info["failed_tests"]) == set(F2P) and empty.info["missing_tests"] == []


async def test_the_verdict_is_a_config_of_the_environment(manager, image):
    task = make_task(image)
    by_values = await episode(manager, task, RepoEnv.worked_example(task) or [])
    by_junit = await episode(manager, task, RepoEnv.worked_example(task) or [], verdict="junit")
    assert (by_values.reward, by_values.info["verdict"]) == (1.0, "values")
    assert (by_junit.reward, by_junit.info["verdict"]) == (1.0, "junit")
    assert by_junit.info["verdict_fallback"] == "repo-v1 is configured with verdict: junit"


async def test_the_sample_task_conforms(manager):
    await check_environment("repo-v1", manager=manager)


async def test_the_sandbox_runs_the_tasks_image_and_holds_no_hidden_test(manager, image):
    task = make_task(image)
    assert RepoEnv().sandbox_settings_for(task).image == image
    s = await manager.create("repo-v1", task)
    try:
        assert s.observation.messages[-1].content == task["problem_statement"]
        out = await manager.step(
            s.session_id, [run("git status --porcelain; ls tests; cat mathx/__init__.py")]
        )
        assert out.messages[0].content == f"[exit code 0]\ntest_basic.py\n{_MATH}"
        split = f'"{MARKER[:6]}""{MARKER[6:]}"'  # the command line never holds the marker itself
        out = await manager.step(
            s.session_id, [run(f"grep -rl {split} /workspace /repo /tmp /home; echo $?")]
        )
        assert out.messages[0].content == "[exit code 0]\n1\n"  # grep found nothing
    finally:
        await manager.close(s.session_id)
    assert image in {pool.settings.image for pool in manager.sandbox_pools.pools()}


async def test_a_patch_breaking_a_pass_to_pass_test_scores_0_naming_it(grade, image):
    task = make_task(image)
    broken = await grade(task, BREAK_ADD.encode())
    assert broken.reward == 0.0 and broken.info["failed_tests"] == {"tests/test_basic.py::test_add": "failed"}
    assert (await grade(task, GOLD.encode())).reward == 1.0


async def test_a_listed_id_the_test_patch_does_not_create_is_missing(grade, image):
    task = make_task(
        image, fail_to_pass=[*F2P, "tests/test_mul.py::test_nowhere", "tests/test_gone.py::test_x"]
    )
    result = await grade(task, GOLD.encode())
    assert result.reward == 0.0
    assert result.info["missing_tests"] == ["tests/test_mul.py::test_nowhere", "tests/test_gone.py::test_x"]
    assert result.info["failed_tests"] == {}


async def test_the_verdict_is_by_values_and_says_where_it_falls_back_to_junit(grade, image):
    assert (await grade(make_task(image), GOLD.encode())).info["verdict"] == "values"
    no_gold = await grade(make_task(image, patch=None), GOLD.encode())
    assert no_gold.reward == 1.0 and no_gold.info["verdict"] == "junit"
    assert no_gold.info["verdict_fallback"] == "the task has no gold patch"
    bare = HIDDEN.replace("+    assert ", "+    ").replace("+        assert ", "+        ")  # no assert left
    mixed = await grade(make_task(image, test_patch=bare), GOLD.encode())
    assert mixed.reward == 1.0 and mixed.info["verdict"] == "values"
    assert sorted(mixed.info["junit_only_tests"]) == sorted(F2P)  # test_basic's assert still judged by value
    assert sorted(mixed.info["unsafe_fail_to_pass"]) == sorted(F2P)  # so --check drops the task
    assert sorted(no_gold.info["unsafe_fail_to_pass"]) == sorted(F2P)
    alone = await grade(make_task(image, test_patch=bare, pass_to_pass=[]), b"")
    assert alone.reward == 1.0 and alone.info["verdict"] == "junit"  # nothing the probes could check
    assert "no listed test file has an assert" in alone.info["verdict_fallback"]


async def test_a_patch_that_does_not_apply_scores_0_with_the_reason(grade, image):
    result = await grade(make_task(image), GOLD.replace("return a + b\n+", "return a ** b\n+").encode())
    assert result.reward == 0.0 and result.info["reason"].startswith("the patch does not apply: error: ")
    assert "mathx/__init__.py" in result.info["reason"] and "mathx/__init__.py" in result.info["apply_error"]


async def test_a_hanging_test_run_is_cut_by_the_timeout(grade, image):
    hang = GOLD.replace("+    return a * b", "+    while True:\n+        pass")
    hang = hang.replace("@@ -4,3 +4,3 @@", "@@ -4,3 +4,4 @@")
    result = await grade(make_task(image), hang.encode(), timeout=5.0)
    assert result.reward == 0.0 and result.info["reason"] == "the tests timed out"
    assert result.info["grade_s"] < 60


async def test_committed_and_untracked_changes_count_and_test_files_do_not(manager, image):
    task = make_task(image)
    fixed = _MATH.replace("return a + b\n", "return a * b\n").replace("return a * b", "return a + b", 1)
    fix = [
        ToolCall(name="write_file", arguments={"path": "mathx/__init__.py", "content": fixed}, id="w"),
        run("git add -A && git -c user.name=a -c user.email=a@a commit -qm fix"),
        ToolCall(name="write_file", arguments={"path": "mathx/extra.py", "content": "X = 1\n"}, id="w"),
    ]
    result = await episode(manager, task, fix)
    assert result.reward == 1.0, result.info
    # the agent's own version of a hidden test file is dropped: the hidden one runs
    cheat = "def test_mul():\n    pass\n\n\nclass TestMore:\n    def test_square(self):\n        pass\n"
    forged = await episode(
        manager,
        task,
        [ToolCall(name="write_file", arguments={"path": "tests/test_mul.py", "content": cheat}, id="w")],
    )
    assert forged.reward == 0.0 and set(forged.info["failed_tests"]) == set(F2P)
    assert hidden_paths(HIDDEN) == ["tests/test_mul.py"]


async def test_a_patch_carrying_its_own_hidden_test_file_is_graded_on_the_hidden_one(grade, image):
    """The captured diff is the agent's to forge (its git, its sandbox): the grader drops the
    hidden paths itself, so a stub of the hidden test file neither runs nor blocks the test patch."""
    stub = "+def test_mul():\n+    pass\n+\n+\n+class TestMore:\n+    def test_square(self):\n+        pass\n"
    forged = "diff --git a/tests/test_mul.py b/tests/test_mul.py\nnew file mode 100644\n--- /dev/null\n"
    forged += f"+++ b/tests/test_mul.py\n@@ -0,0 +1,7 @@\n{stub}"
    result = await grade(make_task(image), forged.encode())
    assert result.reward == 0.0 and set(result.info["failed_tests"]) == set(F2P), result.info
    result = await grade(make_task(image), (forged + GOLD).encode())
    assert result.reward == 1.0, result.info


APPEND_BASIC = _context("""\
diff --git a/tests/test_basic.py b/tests/test_basic.py
--- a/tests/test_basic.py
+++ b/tests/test_basic.py
@@ -3,3 +3,8 @@ from mathx import add
.
 def test_add():
     assert add(2, 3) == 5
+
+
+def test_mul_too():
+    from mathx import mul
+    assert mul(3, 4) == 12
""")
MONKEYPATCH = _context("""\
diff --git a/tests/test_basic.py b/tests/test_basic.py
--- a/tests/test_basic.py
+++ b/tests/test_basic.py
@@ -1,2 +1,4 @@
+import mathx
+mathx.mul = lambda a, b: a * b
 from mathx import add
.
""")


async def test_an_edit_elsewhere_in_a_hidden_test_file_is_dropped(grade, image):
    """The test patch changes the end of a test file; the agent's diff changes its top (a hunk
    that would apply beside the hidden one): it is dropped, so its monkeypatch never runs."""
    task = make_task(image, test_patch=APPEND_BASIC, fail_to_pass=["tests/test_basic.py::test_mul_too"])
    result = await grade(task, MONKEYPATCH.encode())
    assert result.reward == 0.0 and result.info["failed_tests"] == {
        "tests/test_basic.py::test_mul_too": "failed"
    }
    assert (await grade(task, GOLD.encode())).reward == 1.0


def test_hidden_paths_are_excluded_by_git_whatever_their_names(tmp_path):
    """git's own reading of the test patch names each path (quoted, renamed, with glob characters),
    and the exclusion built from it drops exactly those files from another patch."""
    names = ["tests/test_ü.py", "tests/a b[1]*.py", "tests/plain.py", "tests/other.py"]
    repo = tmp_path / "r"
    (repo / "tests").mkdir(parents=True)
    for name in names:
        (repo / name).write_text("x = 1\n")
    (repo / "tests/plain.py").write_text("x = 1\n" + "y = 0\n" * 20)  # long enough to be a rename
    _git(tmp_path, "init", "-q", "r")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    for name in names:
        (repo / name).write_text("x = 2\n" + ("y = 0\n" * 20 if name == "tests/plain.py" else ""))
    _git(repo, "mv", "tests/plain.py", "tests/renamed.py")
    agent = subprocess.run(
        ["git", "-C", str(repo), "diff", "-M", "HEAD"], env=_GIT, capture_output=True
    ).stdout
    assert b"rename from tests/plain.py" in agent and b'test_\\303\\274.py"' in agent
    assert set(_git_numstat(repo, agent)) == {*names, "tests/renamed.py"} - {
        "tests/plain.py"
    }  # new names only
    hidden = sorted({*_git_numstat(repo, agent), *hidden_paths(agent.decode())})
    assert set(hidden) == {*names, "tests/renamed.py"}
    _git(repo, "reset", "-q", "--hard")
    keep = [p for p in hidden if p != "tests/other.py"]
    excludes = [f"--exclude={glob_literal(p)}" for p in keep]
    r = subprocess.run(
        ["git", "-C", str(repo), "apply", *excludes, "-"], input=agent, env=_GIT, capture_output=True
    )
    assert r.returncode == 0, r.stderr
    changed = {p for p in names if (repo / p).exists() and (repo / p).read_text().startswith("x = 2")}
    assert changed == {"tests/other.py"}
    assert (repo / "tests/plain.py").exists() and not (repo / "tests/renamed.py").exists()


def _git_numstat(repo: Path, patch: bytes) -> list[str]:
    r = subprocess.run(
        ["git", "-C", str(repo), "apply", "--numstat", "-z", "-"], input=patch, env=_GIT, capture_output=True
    )
    assert r.returncode == 0, r.stderr
    return _numstat_paths(r.stdout)


async def test_a_task_naming_a_missing_image_is_a_bad_task_at_once(manager, image):
    """Its pool would retry creating sandboxes until the acquire timed out, as an infra failure."""
    missing = f"pqrl-no-such-image:{uuid.uuid4().hex[:12]}"
    t0 = time.monotonic()
    with pytest.raises(BadTask, match=missing):
        await manager.create("repo-v1", {**make_task(image), "image": missing})
    assert time.monotonic() - t0 < 10


async def test_a_pass_to_pass_test_file_the_agent_rewrote_runs_as_it_was(grade, image):
    """The test patch does not touch tests/test_basic.py, but its test is listed: the agent's stub
    of it is dropped, so breaking add() is still caught."""
    stub = "diff --git a/tests/test_basic.py b/tests/test_basic.py\n--- a/tests/test_basic.py\n"
    stub += "+++ b/tests/test_basic.py\n@@ -1,5 +1,2 @@\n-from mathx import add\n-\n-\n"
    stub += " def test_add():\n-    assert add(2, 3) == 5\n+    pass\n"
    result = await grade(make_task(image), (BREAK_ADD + stub).encode())
    assert result.info.get("failed_tests") == {"tests/test_basic.py::test_add": "failed"}, result.info
    assert result.reward == 0.0
    assert graded_paths(RepoTask(**make_task(image))) == ["tests/test_basic.py", "tests/test_mul.py"]


async def test_a_task_the_image_cannot_serve_is_a_bad_task(manager, image):
    with pytest.raises(BadTask, match="/nowhere"):
        await manager.create("repo-v1", make_task(image, repo_path="/nowhere"))
    with pytest.raises(BadTask, match="fail_to_pass"):
        await manager.create("repo-v1", {**make_task(image), "fail_to_pass": []})
    assert manager.live == 0
