"""harbor-v1 and ``pqrl tasks import harbor`` with real Docker: Harbor task directories written here
(FROM the local base image) are imported, their images built offline, and run through sessions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from env_server import registry as registry_module
from env_server.conformance import check_environment
from env_server.registry import register_environment
from env_server.sessions import BadTask, SessionManager
from env_server.types import ToolCall
from tasks.harbor.env import HarborEnv, parse_reward
from tasks.harbor.importer import HarborInvalid, import_harbor
from tasks.suite import load_suite

RUN = "pytest-harbor"
BASE = "pqrl-sandbox-base:latest"
MARKER = "harbor-hidden-marker-7f3a"

# Two tasks: one whose image works in /app (moved to /workspace by the importer), one in /workspace.
TASKS = {
    "sum-numbers": {
        "instruction.md": "Write the sum of the numbers in /data/in.txt to /app/out.txt.\n",
        "task.toml": 'version = "1.0"\n[metadata]\ndifficulty = "easy"\n[verifier]\ntimeout_sec = 60.0\n'
        "[agent]\ntimeout_sec = 120.0\n",
        "environment/Dockerfile": f"FROM {BASE}\nUSER root\n"
        "RUN mkdir -p /data /app && printf '3\\n4\\n5\\n' > /data/in.txt && echo notes > /app/README\n"
        "WORKDIR /app\n",
        "tests/test.sh": f"#!/bin/bash\n# {MARKER}\n"
        'if [ "$(cat /app/out.txt 2>/dev/null)" = "12" ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n",
        "solution/solve.sh": "#!/bin/bash\npython3 -c \"print(sum(int(x) for x in open('/data/in.txt')))\""
        " > /app/out.txt\n",
    },
    "upper-words": {
        "instruction.md": "Write words.txt in upper case to upper.txt (both in /workspace).\n",
        "task.toml": 'version = "1.0"\n[verifier]\ntimeout_sec = 30\n',
        "environment/Dockerfile": f"FROM {BASE}\nCOPY words.txt /workspace/words.txt\n",
        "environment/words.txt": "alpha\nbeta\n",
        "tests/test.sh": "#!/bin/bash\nif cmp -s /workspace/upper.txt /tests/data/expected.txt;"
        " then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n",
        "tests/data/expected.txt": "ALPHA\nBETA\n",
        "solution/solve.sh": "tr a-z A-Z < words.txt > upper.txt\n",
    },
}


def write_tasks(root: Path, tasks: dict[str, dict[str, str]]) -> Path:
    for name, files in tasks.items():
        for rel, text in files.items():
            path = root / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = write_tasks(tmp_path_factory.mktemp("harbor") / "demo", TASKS)
    return import_harbor(root, progress=lambda m: None)


async def call(manager: SessionManager, sid: str, name: str, **arguments) -> str:
    result = await manager.step(sid, [ToolCall(name=name, arguments=arguments, id="c")])
    return result.messages[0].content


def test_import_writes_a_suite_of_both_tasks(suite):
    assert suite.manifest.env_id == "harbor-v1" and suite.manifest.kind == "harbor"
    by_id = {t.id: t for t in suite.tasks}
    assert set(by_id) == {"sum-numbers", "upper-words"}
    t = by_id["sum-numbers"]
    assert (t.agent_timeout_s, t.verifier_timeout_s) == (120.0, 60.0) and MARKER in t.tests["test.sh"]
    assert set(by_id["upper-words"].tests) == {"test.sh", "data/expected.txt"}
    assert by_id["upper-words"].verifier_timeout_s == 30.0 and t.image.startswith("pqrl-harbor-sum-numbers:")


@pytest.mark.parametrize("task_id", ["sum-numbers", "upper-words"])
async def test_the_solution_scores_one_and_an_empty_episode_zero(manager, suite, task_id):
    task = suite.task(task_id).model_dump()
    s = await manager.create("harbor-v1", task)
    assert s.observation.messages[-1].content == suite.task(task_id).instruction
    for c in HarborEnv.worked_example(task):
        step = await manager.step(s.session_id, [c])
        assert step.messages[0].status.value == "ok", step.messages[0].content
    result = await manager.evaluate(s.session_id)
    assert result.reward == 1.0, result.info
    await manager.close(s.session_id)
    empty = await manager.create("harbor-v1", task)
    result = await manager.evaluate(empty.session_id)
    assert result.reward == 0.0 and result.info["verifier_exit_code"] == 0, result.info
    await manager.close(empty.session_id)


async def test_the_tests_are_not_in_the_sandbox_before_grading(manager, suite):
    s = await manager.create("harbor-v1", suite.task("sum-numbers").model_dump())
    # the image's working directory is the agent's writable /workspace, seeded from the image
    assert (await call(manager, s.session_id, "run", command="cat README; readlink /app")).endswith(
        "notes\n/workspace\n"
    )
    listed = await call(manager, s.session_id, "run", command="ls -A /tests/ /tmp/.harbor 2>&1; true")
    assert "test.sh" not in listed and "No such file" in listed, listed
    grep = f"grep -rlsI --exclude-dir=proc --exclude-dir=sys {MARKER} /; true"
    assert await call(manager, s.session_id, "run", command=grep, timeout=120) == "[exit code 0]\n"
    await manager.close(s.session_id)


async def test_what_the_agent_plants_does_not_score(manager, suite):
    s = await manager.create("harbor-v1", suite.task("sum-numbers").model_dump())
    plant = (
        "echo 11 > /app/out.txt && mkdir -p /tmp/.harbor/logs/verifier /tmp/.harbor/tests"
        " && echo 1 > /logs/verifier/reward.txt"
        " && printf 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh"
    )
    assert (await call(manager, s.session_id, "run", command=plant)).startswith("[exit code 0]")
    result = await manager.evaluate(s.session_id)  # before submit, as when the turns run out
    assert result.reward == 0.0, result.info
    # grading ended the episode: the tests are in the sandbox now, so no further call runs
    out = await manager.step(
        s.session_id, [ToolCall(name="run", arguments={"command": "cat /tests/test.sh"})]
    )
    assert out.messages[0].status.value == "skipped"
    assert out.done and MARKER not in out.messages[0].content
    await manager.close(s.session_id)


async def test_a_missing_or_bad_reward_file_scores_zero_with_the_reason(manager, suite):
    task = suite.task("upper-words").model_copy(update={"tests": {"test.sh": "echo no reward written\n"}})
    s = await manager.create("harbor-v1", task.model_dump())
    result = await manager.evaluate(s.session_id)
    assert result.reward == 0.0 and "no reward file /logs/verifier/reward.txt" in result.info["reason"]
    await manager.close(s.session_id)
    for text, why in [
        ("1.5", "not a number in [0, 1]"),
        ("nan", "not a number in [0, 1]"),
        ("yes", "not a number"),
    ]:
        assert parse_reward(text)[0] == 0.0 and why in parse_reward(text)[1]
    assert parse_reward(" 0.25\n") == (0.25, "")


def test_bad_directories_are_line_and_field_problems_and_nothing_is_written(tmp_path):
    bad = {
        "no-instruction": {**TASKS["upper-words"]},
        "bad-toml": {**TASKS["upper-words"], "task.toml": "[verifier]\ntimeout_sec = \n"},
        "bad-from": {
            **TASKS["upper-words"],
            "environment/Dockerfile": "FROM registry.invalid/none:1\nRUN true\n",
        },
        "bad-timeout": {**TASKS["upper-words"], "task.toml": '[agent]\nx = 1\ntimeout_sec = "soon"\n'},
    }
    del bad["no-instruction"]["instruction.md"]
    root = write_tasks(tmp_path / "bad", bad)
    with pytest.raises(HarborInvalid) as e:
        import_harbor(root, progress=lambda m: None)
    problems = {(Path(p.path).relative_to(root).as_posix(), p.line, p.field) for p in e.value.problems}
    assert problems == {
        ("no-instruction/instruction.md", 0, "instruction.md"),
        ("bad-toml/task.toml", 2, "toml"),
        ("bad-from/environment/Dockerfile", 1, "FROM"),
        ("bad-timeout/task.toml", 3, "agent.timeout_sec"),
    }
    out = tmp_path / "suite.jsonl"
    cli = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "tasks", "import", "harbor", str(root), "-o", str(out)],
        capture_output=True, text=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert cli.returncode == 2 and not out.exists(), cli.stderr
    assert "Traceback" not in cli.stderr and "registry.invalid/none:1" in cli.stdout
    assert "bad-toml/task.toml line 2: toml: unparsable" in cli.stdout


def test_the_cli_writes_a_suite_that_validates(tmp_path):
    root = write_tasks(tmp_path / "one", {"upper-words": TASKS["upper-words"]})
    out = tmp_path / "suite.jsonl"
    cli = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "tasks", "import", "harbor", str(root / "upper-words"),
         "-o", str(out)],
        capture_output=True, text=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    loaded = load_suite(out)
    assert [t.id for t in loaded.tasks] == ["upper-words"] and loaded.manifest.name == "upper-words"
    assert json.loads(out.read_text().splitlines()[1])["kind"] == "harbor"


async def test_harbor_v1_conforms_with_an_imported_task_as_its_sample(manager, suite):
    # `pqrl env check` runs these rules, the worked example (solve.sh, then submit) earning 1 among them
    register_environment(
        "harbor-sample-v1", "tasks.harbor.env:HarborEnv", sample_task=suite.task("sum-numbers").model_dump()
    )
    try:
        report = await check_environment("harbor-sample-v1", manager=manager)
    finally:
        registry_module._REGISTRY.pop("harbor-sample-v1")
    passed = {r.name for r in report.rules if r.passed and not r.skipped}
    assert {"worked example earns 1", "empty episode earns 0"} <= passed


async def test_a_task_naming_an_image_docker_lacks_is_a_bad_task(manager, suite):
    task = suite.task("upper-words").model_copy(update={"image": "pqrl-harbor-absent:none"})
    with pytest.raises(BadTask, match="pqrl-harbor-absent:none cannot run as a Harbor sandbox"):
        await manager.create("harbor-v1", task.model_dump())


@pytest.mark.parametrize(
    "sabotage",
    [
        "mkdir -p /tmp/.harbor/x/y && chmod 000 /tmp/.harbor/x",  # a tree the grader cannot clear
        "dd if=/dev/zero of=/tmp/fill bs=1M count=400 2>/dev/null; true",  # /tmp full: no room for the tests
    ],
)
async def test_sabotaging_the_grader_scores_zero_not_an_error(manager, suite, sabotage):
    task = suite.task("sum-numbers").model_dump()
    s = await manager.create("harbor-v1", task)
    for c in HarborEnv.worked_example(task)[:2]:  # solved, then sabotaged
        await manager.step(s.session_id, [c])
    assert (await call(manager, s.session_id, "run", command=sabotage)).startswith("[exit code 0]")
    result = await manager.evaluate(s.session_id)
    assert result.reward == 0.0 and result.info["reason"], result.info
    await manager.close(s.session_id)


def test_images_that_fail_to_build_or_lack_python_are_problems(tmp_path):
    task = {k: v for k, v in TASKS["upper-words"].items() if not k.startswith("environment/")}
    bad = {
        "no-python": {
            **task,
            "environment/Dockerfile": f"FROM {BASE}\nUSER root\nRUN rm -f /usr/bin/python3*\n",
        },
        "run-fails": {**task, "environment/Dockerfile": f"FROM {BASE}\nRUN exit 7\n"},
        "no-pip": {**task, "environment/Dockerfile": f"FROM {BASE}\nRUN nopip-cmd install requests\n"},
        "offline": {
            **task,
            "environment/Dockerfile": f"FROM {BASE}\nRUN python3 -c "
            "\"import urllib.request as u; u.urlopen('http://pypi.org/simple/', timeout=20)\"\n",
        },
    }
    root = write_tasks(tmp_path / "bad", bad)
    with pytest.raises(HarborInvalid) as e:
        import_harbor(root, progress=lambda m: None)
    reasons = {Path(p.path).parent.name: (p.field, p.reason) for p in e.value.problems}
    field, reason = reasons["no-python"]
    assert field == "image" and reason.endswith("has no python3, which the sandbox's exec agent needs"), (
        reason
    )
    assert reasons["run-fails"][0] == "image" and "7" in reasons["run-fails"][1]
    # the failing command's own error, above docker's last line, in one line of the problem
    no_pip = reasons["no-pip"][1]
    assert "nopip-cmd: not found" in no_pip and "returned a non-zero code: 127" in no_pip, no_pip
    assert "\n" not in no_pip and "\x1b" not in no_pip and "DEPRECATED" not in no_pip, no_pip
    assert "without network" not in no_pip and "without network" in reasons["offline"][1], reasons
    # a failed build leaves no container behind (docker build --force-rm)
    ps = subprocess.run(
        ["docker", "ps", "-a", "--no-trunc", "--format", "{{.Command}}"], capture_output=True, text=True
    )
    assert "exit 7" not in ps.stdout and "-c command -v python3" not in ps.stdout
