"""data-v1 in real sandboxes: the files reach /workspace, the worked examples and every task's gold
command print what they claim, and the reward needs the file to have been read."""

from __future__ import annotations

import pytest

from env_server.conformance import check_environment
from env_server.sessions import SessionManager
from env_server.types import ToolCall
from launcher.jobconfig import ConfigInvalid, load_config
from launcher.services import sandboxed_envs
from tasks.data import _DEMOS, data_suite
from tasks.generators import Generate, generate_suite
from tasks.suite import parse_suite

RUN = "pytest-data-env"


async def call(manager: SessionManager, sid: str, name: str, **arguments) -> str:
    result = await manager.step(sid, [ToolCall(name=name, arguments=arguments, id="c")])
    return result.messages[0].content


def test_suites_are_seeded_disjoint_and_round_trip():
    a, b = data_suite(40, seed=0), data_suite(40, seed=1)
    assert a.to_jsonl() == data_suite(40, seed=0).to_jsonl()
    assert not {t.id for t in a.tasks} & {t.id for t in b.tasks}
    assert parse_suite(a.to_jsonl()).id == a.id
    for t in a.tasks:  # the numbers never reach the prompt
        assert not any(line in t.question for line in next(iter(t.files.values())).split())
    asked = {t.question.split("What is the ")[1].split()[0] for t in a.tasks}
    assert asked == {"total", "largest", "smallest"}
    assert all(t.kind == "data" and t.id.startswith("data2-") for t in data_suite(5, level=2).tasks)


@pytest.mark.parametrize("bad", [{"level": 3}, {"shots": 3}, {"format_reward": 1.0}])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(ValueError):
        data_suite(4, **bad)


def test_generators_and_config_agree(tmp_path):
    built = generate_suite(Generate("data", n=8, seed=3))
    assert built.manifest.env_id == "data-v1" and built.manifest.defaults == {"shots": 2, "level": 1}
    path = tmp_path / "job.yaml"
    path.write_text("run: d\ntasks:\n  suites:\n    - generate: data\n      n: 8\n      seed: 3\n")
    cfg = load_config(path)
    assert cfg.tasks.suites[0].build().tasks == built.tasks
    assert sandboxed_envs(cfg) == ["data-v1"]
    calc = load_config(path, {"tasks.suites": [{"generate": "calc", "n": 4}]})
    assert sandboxed_envs(calc) == []
    with pytest.raises(ConfigInvalid, match="level applies to calc and data"):
        load_config(path, {"tasks.suites": [{"generate": "search", "level": 1}]})
    with pytest.raises(ConfigInvalid, match="coding: format_reward"):
        load_config(path, {"tasks.suites": [{"generate": "coding", "format_reward": 0.1}]})


async def test_data_env_conforms(manager):
    await check_environment("data-v1", manager=manager)


async def test_worked_examples_and_gold_commands_print_the_answers(manager):
    """Each level's examples, run on their files, print what the prompt shows; and every gold
    command of 12 generated tasks per level prints the task's answer."""
    for level, demos in _DEMOS.items():
        for _question, file, content, command, shown in demos:
            task = {"kind": "data", "id": "demo", "question": "q", "answer": shown, "files": {file: content}}
            s = await manager.create("data-v1", task)
            assert await call(manager, s.session_id, "run", command=command) == shown
            await manager.close(s.session_id)
        for task in data_suite(12, seed=7, level=level).tasks:
            s = await manager.create("data-v1", task.model_dump())
            assert await call(manager, s.session_id, "run", command=task.solution) == task.answer
            await manager.close(s.session_id)


async def test_reward_needs_the_file_read(manager):
    task = data_suite(1, seed=5).tasks[0]
    file = next(iter(task.files))

    async def episode(*calls: tuple[str, dict]) -> tuple[float, dict]:
        s = await manager.create("data-v1", task.model_dump(), env_kwargs={"format_reward": 0.2})
        for name, args in calls:
            await call(manager, s.session_id, name, **args)
        r = await manager.evaluate(s.session_id)
        await manager.close(s.session_id)
        return r.reward, r.info

    reward, info = await episode(("run", {"command": task.solution}), ("answer", {"value": task.answer}))
    assert reward == 1.0 and info["read_file"] and info["grounded"]
    assert (await episode(("answer", {"value": task.answer})))[0] == 1.0  # a lucky guess is still right
    assert (await episode(("answer", {"value": "7"})))[0] == 0.0  # a bare wrong guess earns nothing
    first = task.files[file].split()[0]  # read the file, submit what was printed, but wrong
    wrong_read = (("run", {"command": f"head -1 {file}"}), ("answer", {"value": first}))
    assert first != task.answer and (await episode(*wrong_read))[0] == pytest.approx(0.2)
    echoed = (("run", {"command": f"echo {first}"}), ("answer", {"value": first}))  # never read the file
    assert (await episode(*echoed))[0] == 0.0
    out = await call_once(manager, task, "python3 -c 'import sys; sys.exit(3)'")
    assert out.startswith("[exit code 3]")


async def call_once(manager: SessionManager, task, command: str) -> str:
    s = await manager.create("data-v1", task.model_dump())
    try:
        return await call(manager, s.session_id, "run", command=command)
    finally:
        await manager.close(s.session_id)
