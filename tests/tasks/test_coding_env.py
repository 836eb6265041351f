"""coding-v1 end to end in real sandboxes: reset, the tools, grading of the agent's workspace."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from env_server.conformance import check_environment
from env_server.sessions import SessionManager
from env_server.types import ToolCall
from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from tasks.coding.env import _DEMOS, builtin_suite, demonstration
from tasks.coding.grader import CodingGrader
from tasks.generators import Generate, generate_suite
from tasks.suite import CodingTask
from tests.tasks.conftest import leftovers

RUN = "pytest-coding-env"


async def call(manager: SessionManager, sid: str, name: str, **arguments) -> str:
    result = await manager.step(sid, [ToolCall(name=name, arguments=arguments, id="c")])
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
    assert "caf\\xe9.txt" in result.info["dropped_paths"], "a name that is not UTF-8 is shown escaped"
    result.model_dump_json()  # and the reward can be sent
    await manager.close(s.session_id)


async def fixed(manager: SessionManager, task_id: str = "roman-03") -> str:
    """A session on ``task_id`` with its gold patch applied by the agent; its id."""
    task = builtin_suite().task(task_id)
    s = await manager.create("coding-v1", task.model_dump())
    await call(manager, s.session_id, "write_file", path="/tmp/fix.diff", content=task.gold_patch)
    out = await call(manager, s.session_id, "run", command="git apply /tmp/fix.diff")
    assert out.startswith("[exit code 0]"), out
    return s.session_id


async def fixed_then(manager: SessionManager, command: str) -> str:
    """``fixed``, then ``command`` run by the agent (it must succeed); the session's id."""
    sid = await fixed(manager)
    out = await call(manager, sid, "run", command=command)
    assert out.startswith("[exit code 0]"), out
    return sid


# Left beside a correct fix, outside the task's source files: dropped, and the fix scores 1. The
# huge files are 60 MiB: big, yet they fit the workspace tmpfs (SandboxSettings.workspace_mb).
JUNK = {
    "huge_new_file": ("head -c 60M /dev/urandom > junk.bin", "junk.bin"),
    "huge_repo_file": ("head -c 60M /dev/zero | tr '\\0' x > README.md", "README.md"),
    "sparse_new_file": ("truncate -s 10G junk.img", "junk.img"),
    "sparse_repo_file": ("truncate -s 10G README.md", "README.md"),
    "fifo_named_py": ("mkfifo extra.py", "extra.py"),
    "fifo_repo_file": ("rm README.md && mkfifo README.md", "README.md"),
    "dev_zero_link": ("ln -s /dev/zero zero.py", "zero.py"),
    "dev_zero_repo_link": ("ln -sf /dev/zero README.md", "README.md"),
    "source_linked_in_workspace": ("mv roman.py fixed.py && ln -s fixed.py roman.py", "fixed.py"),
}


@pytest.mark.parametrize("command", list(JUNK.values()), ids=list(JUNK))
async def test_junk_outside_the_source_files_is_dropped_and_the_fix_scores_one(manager, command):
    command, path = command
    sid = await fixed_then(manager, command)
    result = await manager.evaluate(sid)
    assert result.reward == 1.0, result.info["reason"]
    assert path in result.info["dropped_paths"] and not result.info["tampered"], result.info
    await manager.close(sid)


# A task source file the grader cannot take as text: 0, with the reason, and nothing waits on it.
UNGRADABLE = {
    "huge": ("head -c 60M /dev/zero | tr '\\0' '#' >> roman.py", "over the limit of 1048576 bytes"),
    "sparse": ("truncate -s 10G roman.py", "is 10737418240 bytes, over the limit of 1048576 bytes"),
    "fifo": ("rm roman.py && mkfifo roman.py", "is a FIFO, not a regular file"),
    "directory": ("rm roman.py && mkdir roman.py", "is a directory, not a regular file"),
    "dev_zero_link": ("ln -sf /dev/zero roman.py", "is a link out of the workspace (to /dev/zero)"),
    "stdin_link": ("ln -sf /dev/stdin roman.py", "is a link out of the workspace"),
    "not_utf8": ("printf '\\377' >> roman.py", "is not UTF-8 text"),
}


@pytest.mark.parametrize("command", list(UNGRADABLE.values()), ids=list(UNGRADABLE))
async def test_a_source_file_that_cannot_be_taken_scores_zero_with_the_reason(manager, command):
    command, why = command
    sid = await fixed_then(manager, command)
    t0 = time.monotonic()
    result = await manager.evaluate(sid)
    assert time.monotonic() - t0 < 30, "capture waited on the file"
    info = result.info
    assert result.reward == 0.0 and why in info["rejected_sources"]["roman.py"], info
    assert info["reason"].startswith("source file roman.py ") and why in info["reason"], info["reason"]
    assert info["changed_sources"] == ["roman.py"] and not info["tampered"], info
    await manager.close(sid)


GROW = r"""
import os, sys, time
chunk = b"# grows\n" * 65536  # 512 KiB
with open(sys.argv[1], "ab") as f:
    for _ in range(400):  # 200 MiB at most, at about 50 MiB/s
        if os.path.exists("/tmp/stop-growing"):
            break
        f.write(chunk)
        f.flush()
        time.sleep(0.01)
"""


@pytest.mark.parametrize(("path", "reward"), [("roman.py", 0.0), ("README.md", 1.0)])
async def test_a_file_growing_while_it_is_captured(manager, path, reward):
    """Only possible for something outliving its command (here a call of the test's own): a growing
    source file is over the limit, a growing other file is dropped; neither is read to its end."""
    sid = await fixed(manager)
    sandbox = manager._sessions[sid].sandbox
    grower = asyncio.create_task(sandbox.exec(["python3", "-c", GROW, path], cwd="/workspace", timeout=60))
    try:
        size = "stat -c %s " + path
        while int((await sandbox.exec(size, cwd="/workspace")).stdout or 0) < 2 << 20:
            await asyncio.sleep(0.05)
        result = await manager.evaluate(sid)
    finally:
        await sandbox.exec("touch /tmp/stop-growing")
        await grower
    assert result.reward == reward, result.info["reason"]
    if reward == 0.0:
        assert "limit of 1048576 bytes" in result.info["rejected_sources"][path], result.info
    else:
        assert path in result.info["dropped_paths"]
    await manager.close(sid)


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


# the tests of each worked example's repository: (test function, its file's text)
DEMO_TESTS = {
    "calc": ("test_add", "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"),
    "shapes": (
        "test_area",
        "from shapes import square_area\n\n\ndef test_area():\n    assert square_area(3) == 9\n",
    ),
}


@pytest.mark.parametrize("k", range(len(_DEMOS)))
async def test_each_worked_example_is_what_the_tools_return_and_fixes_its_bug(manager, k):
    """Replayed in a real sandbox on the repository it describes, every step of a worked example
    returns what the example shows (pytest's timings aside) and the fix grades 1."""
    issue, module, steps = _DEMOS[k]
    buggy = next(out for name, _, out in steps if name == "read_file")
    test_name, test_text = DEMO_TESTS[module]
    test_path = f"tests/test_{module}.py"
    task = CodingTask(
        id=f"demo-{module}", repo={f"{module}.py": buggy, test_path: test_text}, issue=issue,
        hidden_tests={test_path: test_text}, fail_to_pass=[f"{test_path}::{test_name}"],
    )  # fmt: skip
    s = await manager.create("coding-v1", task.model_dump(), env_kwargs={"shots": 2})
    messages = s.observation.messages
    assert [m.role for m in messages[:3]] == ["system", "user", "assistant"]
    assert messages[-1].role == "user" and messages[-1].content.startswith(issue)
    for name, arguments, shown in steps:
        got = await call(manager, s.session_id, name, **arguments)
        timing = re.compile(r" in \d+\.\d+s$", re.M)  # pytest's run time differs
        assert timing.sub("", got) == timing.sub("", shown)
    assert (await manager.evaluate(s.session_id)).reward == 1.0
    await manager.close(s.session_id)


def test_shots_show_worked_examples_before_the_issue():
    turns = demonstration(2)
    assert [m.role for m in turns[:3]] == ["user", "assistant", "tool"]
    assert sum(m.role == "user" for m in turns) == 2 and turns[-1].content == "submitted"
    assert generate_suite(Generate("coding", shots=1)).manifest.defaults["shots"] == 1
    assert "shots" not in generate_suite(Generate("coding")).manifest.defaults
    with pytest.raises(ValueError, match="shots must be 0 to 2"):
        generate_suite(Generate("coding", shots=3))
