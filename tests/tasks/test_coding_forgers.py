"""Generic forgers of the probe record (tests/tasks/forgers/: code an agent could append to the task's
source module with its own write_file, knowing nothing of the task; and one source edit the policy
allows) on every built-in coding task: none scores, with the source policy off (the code runs
freely) or on, and none makes the grading fail instead of scoring 0.

With the policy off every forger is graded on all 66 tasks in real containers. With it on, the
policy's verdict is a pure function of the patched file: it is computed here for every task, and
the grader runs on a spread of tasks (one per repository) plus every task whose file the policy
would let through. ``test_the_forgers_really_forge`` shows, in a real container and independently
of how the host judges, that each forger rewrites what the recorder emits: the battery cannot pass
because the forgers are broken.
"""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from tasks.coding.grader import PROBE_RUNTIME_SOURCE, GradeResult
from tasks.coding.policy import check_source
from tests.tasks.conftest import leftovers
from tests.tasks.forgery import APPENDED, EDITS, FORGERS, KIT, TASKS, applies, forged_source, grade_all

RUN = "pytest-coding-forgers"
pytestmark = pytest.mark.timeout(600)
SPREAD = {t.id.rsplit("-", 1)[0] + "-00" for t in TASKS}  # one task per repository
# Scores with held operands and objects by state (bench/results/forgers_after.log): the code lacks a
# raise and the forger guesses the one exception class the module defines (docs/security.md: "one
# exact guess per site still scores"). Listed so that the battery stays strict about all else.
KNOWN_OPEN = {("f1_expected_swap", "tokenizer-03"), ("f4_raise_guess", "tokenizer-03")}


def _sound(result: GradeResult | BaseException) -> str | None:
    """Why a grading is not an ordinary verdict (None: it is one)."""
    if isinstance(result, BaseException):  # a grader failure: the episode would be failed_infra
        return f"grading raised {result!r}"
    try:
        json.dumps(result.info, ensure_ascii=False).encode()
    except (TypeError, ValueError) as e:
        return f"the info does not serialise as UTF-8 JSON: {e}"
    return None


def _let_through(task, forger: str) -> bool:
    """Whether the source policy would let the forged file run (the grader's own check)."""
    path, original, patched = forged_source(task, forger)
    return not check_source(path, patched.encode(), original.encode())


@pytest.mark.parametrize("forger", FORGERS)
async def test_forger_scores_zero_on_every_task(graders, forger):
    tasks = [t for t in TASKS if applies(t, forger)]
    evading = {t.id for t in tasks if _let_through(t, forger)}
    on = [t for t in tasks if t.id in SPREAD or t.id in evading]
    results = await grade_all(graders, [(forger, False, t) for t in tasks] + [(forger, True, t) for t in on])
    assert len(tasks) >= 6 and results
    broken = {k: why for k, r in results.items() if (why := _sound(r))}
    assert not broken, broken
    graded = {k: r for k, r in results.items() if isinstance(r, GradeResult)}
    scored = {k: r.info["reason"] for k, r in graded.items() if r.reward != 0.0}
    assert {k: why for k, why in scored.items() if (k[0], k[2]) not in KNOWN_OPEN} == {}
    for (_, policy, task), r in graded.items():
        if policy and task not in evading:  # refused before anything ran, and flagged
            assert r.info.get("policy_violations") and r.info["tampered"], (task, r.info["reason"])


# A module with a bug in each of double and Box.grow, and the checks a rewritten test would make
# of it, run in a real container by the recorder itself, once honestly and once per forger.
MINI = """class MiniError(ValueError):
    pass


class Box:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Box) and self.v == other.v

    def grow(self):
        return Box(self.v + 2)


def double(x):
    return x * 3


def inc(x):
    return x + 1
"""
DRIVER = """import json, os, sys
base = os.path.dirname(os.path.abspath(__file__))
record = os.path.join(base, sys.argv[1], "record")
os.environ["PQRL_PROBE_FD"] = str(os.open(record, os.O_WRONLY | os.O_CREAT))
sys.path[:0] = [os.path.join(base, "lib"), os.path.join(base, sys.argv[1])]
from pqrl_probe_runtime import probe, raises
import mini


def check(*args):  # an assert that raises ends its test; here each check is a test of its own
    try:
        probe(*args)
    except Exception:
        pass


def test_checks():
    expected = 8
    check(0, ("==",), lambda: mini.double(4), lambda: expected)
    check(1, ("==",), lambda: mini.Box(1).grow(), lambda: mini.Box(2))
    with raises(2):
        mini.inc(1)
    check(3, (), lambda: mini.inc(1))
    check(4, ("<",), lambda: mini.double(4), lambda: expected)


test_checks()
with open(record, "rb") as f:
    print(json.dumps([[e["s"], e["v"]] for e in map(json.loads, f.read().splitlines())]))
"""
HONEST = {  # what the honest record must hold, however objects are encoded
    0: lambda v: v == [12, 8, {"!truth": False}],
    1: lambda v: v[-1] == {"!truth": False},
    2: lambda v: v == [{"!raised": None}],
    3: lambda v: v == [2],
    4: lambda v: v == [12, 8, {"!truth": False}],
}
MINI_ERROR = [
    "mini.MiniError",
    "builtins.ValueError",
    "builtins.Exception",
    "builtins.BaseException",
    "builtins.object",
]
FORGED = {  # forger -> what it must have made the recorder write
    "f1_expected_swap": lambda r: (
        r[0][1] == [8, 8, {"!truth": True}]
        and r[2][1][0]["!raised"] == MINI_ERROR
        and r[4][1] == [12, 8, {"!truth": True}]
    ),
    "f2_frame_locals": lambda r: r[0][1] == [8, 8, {"!truth": True}],
    "f3_always_equal": lambda r: r[1][1][-1] == {"!truth": True},
    "f3_eq_edit": lambda r: r[1][1][-1] == {"!truth": True},
    "f4_raise_guess": lambda r: r[2][1][0]["!raised"] == MINI_ERROR,
    "f4_mro_union": lambda r: {"mini.MiniError", "builtins.KeyError"} <= set(r[2][1][0]["!raised"]),
    "f5_recorder_trap": lambda r: r[3][1] == [{"obj": "builtins.int", "base": 2}],
    "f6_crash_infra": lambda r: any(s not in HONEST for s, _ in r),
}


async def test_the_forgers_really_forge():
    assert set(FORGED) == set(FORGERS)
    files = {"lib/pqrl_probe_runtime.py": PROBE_RUNTIME_SOURCE, "driver.py": DRIVER, "honest/mini.py": MINI}
    files |= {f"{name}/mini.py": f"{MINI}\n\n{KIT}\n\n{source}" for name, source in APPENDED.items()}
    files |= {f"{name}/mini.py": edit(MINI) for name, edit in EDITS.items()}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, text in files.items():
            member = tarfile.TarInfo(path)
            member.size, member.mode = len(text.encode()), 0o644
            tar.addfile(member, io.BytesIO(text.encode()))
    api = DockerAPI()
    sandbox = await DockerSandbox.create(api, SandboxSettings(memory_mb=512), run=RUN)
    try:
        await sandbox.upload(buf.getvalue(), "/tmp/forge")
        records = {}
        for name in ["honest", *FORGERS]:
            run = await sandbox.exec(["python3", "-I", "/tmp/forge/driver.py", name], cwd="/tmp/forge")
            assert run.ok, (name, run.text()[-2000:])
            records[name] = json.loads(run.stdout.decode().strip().splitlines()[-1])
    finally:
        await sandbox.close()
        left = await leftovers(api, RUN)
        await api.close()
    assert left == []
    honest = records["honest"]
    assert [s for s, _ in honest] == list(HONEST) and all(HONEST[s](v) for s, v in honest), honest
    assert {name: records[name] for name, forged in FORGED.items() if not forged(records[name])} == {}
