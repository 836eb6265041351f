"""The data suite: questions about files that exist only inside the agent's sandbox, answered by
running code there (``run``: a shell command, typically ``python3``), graded by the exact number.

The numbers are written into the sandbox's ``/workspace`` at reset and never appear in the prompt,
so no answer can come from the model's head or memory: the episode has to run something that reads
the file. Level 1 asks for the total, the largest or the smallest of a one-number-per-line file;
level 2 asks for one name's total in a ``name,amount`` CSV (a filter before the sum). As with calc,
``shots`` worked examples of the run-and-answer exchange sit in the prompt as earlier turns: a 135M
model copies a shown command far more readily than it writes one from a description.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field

from env_server import Message, RewardResult, tool
from env_server.types import Observation
from tasks.answering import NumberAnswerConfig, NumberAnswerEnv
from tasks.suite import DataTask, Suite, SuiteManifest

__all__ = ["DataEnv", "data_suite", "make_data_task"]

SYSTEM = (
    "You answer questions about data files in your sandbox by running commands.\n"
    "Tools:\n"
    '- run: runs a shell command in /workspace and returns its output. Arguments: {"command": "..."}\n'
    '- answer: submits the final number and ends the task. Arguments: {"value": "84"}\n'
    "The numbers are only in the files: run python3 on the file, then call answer with its output."
)

_OUTPUT_CHARS = 2000  # of a command's output shown to the model: the context budget is small

# What level 1 asks (phrase, python builtin) and level 2's filter-then-sum pipeline.
_OPS = (("total of all the", "sum"), ("largest of the", "max"), ("smallest of the", "min"))
_REDUCE = "python3 -c 'print({fn}(map(int, open(0))))' < {file}"
_FILTER_SUM = "grep '^{name},' {file} | cut -d, -f2 | python3 -c 'print(sum(map(int, open(0))))'"

_SUBJECTS = (
    ("prices", "prices"), ("scores", "test scores"), ("weights", "parcel weights"),
    ("visits", "daily visits"), ("distances", "trip distances"), ("counts", "bird counts"),
    ("sales", "daily sales"), ("rainfall", "rainfall readings"), ("ages", "ages"), ("stock", "stock levels"),
    ("votes", "vote counts"), ("steps", "step counts"),
)  # fmt: skip
_NAMES = ("apples", "pears", "plums", "figs", "limes", "kiwis", "dates", "melons")

# Worked examples (question, file, content, command, what it prints), each level's own pattern first;
# a test runs every command on its file in a sandbox and checks the output shown here.
_DEMOS = {
    1: (
        ("The file orders.txt lists order sizes, one number per line. What is the total of all the order "
         "sizes?", "orders.txt", "310\n42\n775\n96\n", _REDUCE.format(fn="sum", file="orders.txt"), "1223"),
        ("The file heights.txt lists tree heights, one number per line. What is the largest of the tree "
         "heights?", "heights.txt", "38\n112\n67\n", _REDUCE.format(fn="max", file="heights.txt"), "112"),
    ),
    2: (
        ("The file crates.csv lists deliveries as name,amount lines. What is the total amount for pears?",
         "crates.csv", "pears,31\nfigs,12\npears,58\n", _FILTER_SUM.format(name="pears", file="crates.csv"),
         "89"),
        ("The file orders.txt lists order sizes, one number per line. What is the total of all the order "
         "sizes?", "orders.txt", "310\n42\n775\n96\n", _REDUCE.format(fn="sum", file="orders.txt"), "1223"),
    ),
}  # fmt: skip


def _level1(rng: random.Random, task_id: str) -> DataTask:
    stem, noun = rng.choice(_SUBJECTS)
    phrase, fn = rng.choice(_OPS)
    values = [rng.randint(10, 999) for _ in range(rng.randint(5, 9))]
    answer = {"sum": sum, "max": max, "min": min}[fn](values)
    file = f"{stem}.txt"
    return DataTask(
        id=task_id,
        question=f"The file {file} lists {noun}, one number per line. What is the {phrase} {noun}?",
        answer=str(answer),
        files={file: "".join(f"{v}\n" for v in values)},
        solution=_REDUCE.format(fn=fn, file=file),
    )


def _level2(rng: random.Random, task_id: str) -> DataTask:
    stem, noun = rng.choice(_SUBJECTS)
    names = rng.sample(_NAMES, 3)
    rows = [(rng.choice(names), rng.randint(10, 99)) for _ in range(rng.randint(8, 14))]
    name = rows[rng.randrange(len(rows))][0]
    file = f"{stem}.csv"
    return DataTask(
        id=task_id,
        question=f"The file {file} lists {noun} as name,amount lines. What is the total amount for {name}?",
        answer=str(sum(v for n, v in rows if n == name)),
        files={file: "".join(f"{n},{v}\n" for n, v in rows)},
        solution=_FILTER_SUM.format(name=name, file=file),
    )


def make_data_task(rng: random.Random, task_id: str, level: int = 1) -> DataTask:
    return (_level1 if level == 1 else _level2)(rng, task_id)


def data_suite(
    n: int = 256, seed: int = 0, *, name: str = "data", shots: int = 2, level: int = 1,
    format_reward: float = 0.0,
) -> Suite:  # fmt: skip
    """``n`` tasks generated from ``seed`` (disjoint seeds give disjoint task ids and files).

    ``format_reward``: partial credit, when the answer is wrong, for a command that read the task's
    file and succeeded, and for submitting what such a command printed (see ``DataEnv.evaluate``).
    """
    if not 0.0 <= format_reward < 1.0:
        raise ValueError(f"format_reward must be in [0, 1), got {format_reward}")
    if level not in _DEMOS:
        raise ValueError(f"data level must be 1 or 2, got {level}")
    if not 0 <= shots <= len(_DEMOS[level]):
        raise ValueError(f"shots must be 0 to {len(_DEMOS[level])}, got {shots}")
    rng = random.Random(seed)
    defaults: dict[str, Any] = {"shots": shots, "level": level}
    defaults |= {"format_reward": format_reward} if format_reward else {}
    kind = "one-number-per-line" if level == 1 else "name,amount CSV"
    manifest = SuiteManifest(
        name=name, version="1", env_id="data-v1", kind="data", reward="exact_match",
        description=f"{n} questions about {kind} files in the sandbox (seed {seed})", defaults=defaults,
    )  # fmt: skip
    return Suite(manifest, tuple(make_data_task(rng, f"data{level}-{seed}-{i}", level) for i in range(n)))


def demonstration(shots: int, level: int) -> list[Message]:
    """``shots`` worked run-and-answer exchanges."""
    out: list[Message] = []
    for question, _file, _content, command, value in _DEMOS[level][:shots]:
        out += [
            Message(role="user", content=question),
            Message.calling("run", command=command),
            Message(role="tool", name="run", content=value),
            Message.calling("answer", value=value),
            Message(role="tool", name="answer", content="submitted"),
        ]
    return out


class DataConfig(NumberAnswerConfig):
    """data-v1's arguments: calc's, with two worked examples by default, the one-step first."""

    shots: int = Field(2, ge=0, le=2, description="worked examples rendered into the prompt")
    level: Literal[1, 2] = Field(1, description="which worked examples come first")


class DataEnv(NumberAnswerEnv):
    """Task: a DataTask dict; its files are written into ``/workspace`` of the episode's sandbox.

    Config: ``shots`` worked examples (0 to 2), ``level`` (1 or 2: which examples), and
    ``format_reward`` (default 0): the reward of a wrong answer after a command that read the task's
    file and succeeded (half) and whose printed result was submitted (the other half).
    """

    needs_sandbox = True
    task_model = DataTask
    config_model = DataConfig
    settings: DataConfig
    solution = ("solution", "run", "command")

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        t = DataTask.model_validate(task)
        self.expected, self.files = t.answer, tuple(t.files)
        self.submitted: str | None = None
        self.read_ok = False  # a command that named a task file exited 0
        self.printed: list[str] = []  # the outputs of such commands
        for path, content in t.files.items():
            await self.sandbox.write_file(f"/workspace/{path}", content.encode())
        messages = [Message(role="system", content=SYSTEM)]
        messages += demonstration(self.settings.shots, self.settings.level)
        messages.append(Message(role="user", content=t.question))
        return self.observation(messages)

    @tool
    async def run(self, command: str) -> str:
        """Runs a shell command in /workspace and returns what it printed.

        Args:
            command: the command line, run by /bin/sh, e.g. "python3 -c 'print(6 * 7)'".
        """
        result = await self.sandbox.exec(command, timeout=20.0, cwd="/workspace")
        output = result.text().strip()
        if result.ok and any(f in command for f in self.files):
            self.read_ok = True
            self.printed.append(output)
        if len(output) > _OUTPUT_CHARS:
            output = output[:_OUTPUT_CHARS] + " ... (output cut)"
        if result.timed_out:
            return f"[timed out after 20 s]\n{output}"
        return output if result.ok else f"[exit code {result.exit_code}]\n{output}"

    async def evaluate(self) -> RewardResult:
        # Used: a command named the task's file and exited 0; grounded: what it printed was submitted.
        return self.grade(used=self.read_ok, results=self.printed, read_file=self.read_ok)
