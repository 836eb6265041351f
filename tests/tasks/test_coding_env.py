"""coding-v1 end to end in real sandboxes: reset, the tools, grading of the agent's workspace."""

from __future__ import annotations

import asyncio

import pytest

from env_server.conformance import check_environment
from env_server.sessions import SessionManager
from env_server.types import ToolCallRequest
from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.settings import SandboxSettings
from tasks.coding.env import builtin_suite
from tasks.coding.grader import CodingGrader
from tests.tasks.conftest import leftovers

RUN = "pytest-coding-env"


async def call(manager: SessionManager, sid: str, name: str, **arguments) -> str:
    result = await manager.step(sid, [ToolCallRequest(name=name, arguments=arguments, id="c")])
    return result.messages[0].content


async def test_coding_env_conforms(manager):
    await check_environment("coding-v1", manager=manager)


async def test_reset_shows_the_issue_and_commits_the_base(manager):
    task = builtin_suite().task("roman-03")
    s = await manager.create("coding-v1", {"ref": "roman-03"})
    system, user = s.observation.messages
    assert "hidden tests" in system.content and task.issue in user.content
    assert "Source files (only these are graded): roman.py" in user.content
    assert [t["function"]["name"] for t in s.observation.tools] == [
        "run", "read_file", "write_file", "submit", "edit_file"
    ]  # fmt: skip
    out = await call(manager, s.session_id, "run", command="git log --format=%s && git status --porcelain")
    assert out == "[exit code 0]\nBase commit\n"
    assert await call(manager, s.session_id, "read_file", path="roman.py") == task.repo["roman.py"]
    await manager.close(s.session_id)


async def test_edit_file_needs_exactly_one_match(manager):
    s = await manager.create("coding-v1", {"ref": "roman-03"})
    out = await call(manager, s.session_id, "edit_file", path="roman.py", old="return", new="yield")
    assert out.startswith("Error: edit_file failed") and "occurs 5 times" in out
    out = await call(
        manager, s.session_id, "edit_file", path="roman.py", old="text[i - 1]", new="text[i + 1]"
    )
    assert out == "edited /workspace/roman.py"
    await manager.close(s.session_id)


GOLD = ["roman-03", "matrix-00", "tokenizer-02"]


@pytest.mark.parametrize("task_id", GOLD)
async def test_the_gold_patch_applied_by_the_agent_scores_one(manager, task_id):
    task = builtin_suite().task(task_id)
    s = await manager.create("coding-v1", task.model_dump())
    await call(manager, s.session_id, "write_file", path="/tmp/fix.diff", content=task.gold_patch)
    assert (await call(manager, s.session_id, "run", command="git apply /tmp/fix.diff")).startswith(
        "[exit code 0]"
    )
    # Running the visible tests leaves byte-code and caches: noise, not a change.
    assert "passed" in await call(manager, s.session_id, "run", command="python3 -m pytest -q")
    await call(manager, s.session_id, "submit")
    result = await manager.evaluate(s.session_id)
    assert result.reward == 1.0, result.info["reason"]
    info = result.info
    assert info["dropped_paths"] == [] and not info["tampered"] and info["ignored_noise_files"] > 0
    assert info["head"] == info["base_commit"] and not info["head_moved"]
    assert set(info["timings"]) >= {"queue_s", "sandbox_s", "apply_s", "tests_s", "total_s", "capture_s"}
    assert await manager.evaluate(s.session_id) is not None  # graded once after submit, then cached
    await manager.close(s.session_id)


LEFTOVERS = r"""
import os
for i in range(1000):
    os.makedirs("junk", exist_ok=True)
    open(f"junk/f{i}.txt", "w").close()
deep = "deep"
for _ in range(600):
    deep += "/d"
os.makedirs(deep)
os.symlink("loop", "loop")
os.symlink(".", "self")
os.mkdir("locked")
open("locked/x", "w").close()
os.chmod("locked", 0)
open("secret", "w").close()
os.chmod("secret", 0)
open(b"caf\xe9.txt", "w").close()
"""


async def test_a_correct_fix_scores_one_whatever_the_agent_leaves_behind(manager):
    """1,000 files, a deep tree, link loops, unreadable entries, a non-UTF-8 name: the grader's
    listing stays bounded and grades the fix."""
    task = builtin_suite().task("roman-03")
    s = await manager.create("coding-v1", task.model_dump())
    await call(manager, s.session_id, "write_file", path="/tmp/fix.diff", content=task.gold_patch)
    assert (await call(manager, s.session_id, "run", command="git apply /tmp/fix.diff")).startswith(
        "[exit code 0]"
    )
    await call(manager, s.session_id, "write_file", path="/tmp/leftovers.py", content=LEFTOVERS)
    out = await call(manager, s.session_id, "run", command="python3 /tmp/leftovers.py")
    assert out.startswith("[exit code 0]"), out
    result = await manager.evaluate(s.session_id)
    assert result.reward == 1.0, result.info["reason"]
    assert result.info["other_files"] >= 1000 and not result.info["tampered"]
    assert "junk/f0.txt" in result.info["dropped_paths"]
    await manager.close(s.session_id)


async def test_no_change_scores_zero(manager):
    s = await manager.create("coding-v1", {"ref": "stats-00"})
    result = await manager.evaluate(s.session_id)
    assert result.reward == 0.0 and result.info["changed_sources"] == [] and not result.info["tampered"]
    await manager.close(s.session_id)


async def test_gradings_wait_for_a_slot():
    """At most ``slots`` fresh grading containers exist at once; the others queue."""
    api = DockerAPI()
    live = peak = 0

    async def make() -> DockerSandbox:
        nonlocal live, peak
        sandbox = await DockerSandbox.create(api, SandboxSettings(memory_mb=256), run=RUN)
        live += 1
        peak = max(peak, live)
        close = sandbox.close

        async def closing() -> None:
            nonlocal live
            live -= 1
            await close()

        sandbox.close = closing  # type: ignore[method-assign]
        return sandbox

    try:
        grader = CodingGrader(make, slots=asyncio.Semaphore(2))
        tasks = list(builtin_suite().tasks[:5])
        results = await asyncio.gather(*(grader.grade_patch(t, "") for t in tasks))
        assert peak == 2 and all(r.reward == 0.0 for r in results)
        assert max(r.info["timings"]["queue_s"] for r in results) > 0
    finally:
        assert await leftovers(api, RUN) == []
        await api.close()
