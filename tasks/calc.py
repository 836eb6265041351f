"""The calc suite: multi-step arithmetic word problems, a ``calculator`` tool and an ``answer`` tool.

A 135M model cannot multiply two-digit numbers in its head reliably, so the reward (the exact
answer) is reachable only through the tool. Measured with SmolLM2-135M-Instruct: with
the tool described only in the system prompt it never emits a call; with one worked example of the
call-and-answer exchange, most samples attempt one. So the environment renders ``shots`` worked
examples (default 1) into the prompt as earlier turns of the conversation.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from decimal import Decimal
from typing import Any

from env_server import Message, RewardResult, tool
from env_server.types import Observation
from tasks.answering import NumberAnswerEnv
from tasks.suite import CalcTask, Suite, SuiteManifest

__all__ = ["CalcEnv", "calc_suite", "make_calc_task", "safe_eval"]

SYSTEM = (
    "You solve arithmetic word problems with tools.\n"
    "Tools:\n"
    '- calculator: evaluates an arithmetic expression. Arguments: {"expression": "12 * (3 + 4)"}\n'
    '- answer: submits the final number and ends the task. Arguments: {"value": "84"}\n'
    "Compute every step with the calculator, then call answer."
)

# (story, expression) templates; {names} are filled with numbers chosen so every answer is an int.
_TEMPLATES = [
    ("A shop has {a} boxes with {b} pencils in each box. It receives {c} more pencils and then sells {d}. "
     "How many pencils does it have now?", "{a} * {b} + {c} - {d}"),
    ("A train travels at {a} km per hour for {b} hours, then at {c} km per hour for {d} hours. "
     "How many kilometres does it travel in total?", "{a} * {b} + {c} * {d}"),
    ("A farmer plants {a} rows of {b} trees. {c} trees die, and then he plants {d} more rows of {e} trees. "
     "How many trees are there now?", "{a} * {b} - {c} + {d} * {e}"),
    ("A library has {a} shelves holding {b} books each. It gives away {c} books and shares the rest equally "
     "among {d} schools. How many books does each school get?", "({a} * {b} - {c}) / {d}"),
    ("A baker makes {a} trays of {b} cookies every day for {c} days and eats {d} cookies. "
     "How many cookies are left?", "{a} * {b} * {c} - {d}"),
]  # fmt: skip

# Level 1: one operation on two numbers, still beyond a 135M model's mental arithmetic: a first
# rung that a small policy sometimes solves, so GRPO has signal (a 0/1 reward with pass rate c has
# variance c(1 - c), which is nonzero only for 0 < c < 1).
_EASY_TEMPLATES = [
    ("A box holds {a} apples. How many apples are in {b} boxes?", "{a} * {b}"),
    ("Tom has {c} marbles and buys {a} more. How many marbles does he have now?", "{c} + {a}"),
    ("A tank holds {c} litres of water. {a} litres are used. How many litres are left?", "{c} - {a}"),
    ("A bus carries {a} people on each trip. How many people does it carry in {b} trips?", "{a} * {b}"),
]  # fmt: skip

# Worked examples rendered into the prompt as earlier turns: (question, expression, answer).
_DEMOS = (
    ("A school has 23 classes with 27 students each. 58 students leave. How many students are left?",
     "23 * 27 - 58", "563"),
    ("A crate holds 24 bottles. How many bottles are in 37 crates?", "24 * 37", "888"),
)  # fmt: skip


def safe_eval(expression: str) -> int | float:
    """Evaluates + - * / // % ** and parentheses on numbers; nothing else is allowed."""
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}  # fmt: skip

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return ops[type(node.op)](left, right)
        raise ValueError(f"unsupported syntax: {ast.dump(node)[:60]}")

    if len(expression) > 500:
        raise ValueError("expression too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {e.msg}") from None
    return ev(tree)


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _numbers_in(text: str) -> set[Decimal]:
    """The unsigned numbers written in ``text`` ("1,200" reads as 1 and 200: questions use no commas)."""
    return {Decimal(m).normalize() for m in _NUMBER.findall(text)}


def _fmt(value: int | float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def make_calc_task(rng: random.Random, task_id: str, level: int = 2) -> CalcTask:
    story, expr = rng.choice(_EASY_TEMPLATES if level == 1 else _TEMPLATES)
    while True:
        v = {k: rng.randint(12, 99) for k in "abcde"}
        v["c"] = rng.randint(20, 400)
        expression = expr.format(**v)
        value = safe_eval(expression)
        if float(value).is_integer() and value > 0:
            return CalcTask(id=task_id, question=story.format(**v), answer=_fmt(value), expression=expression)


def calc_suite(
    n: int = 256,
    seed: int = 0,
    *,
    name: str = "calc",
    shots: int = 1,
    level: int = 2,
    format_reward: float = 0.0,
) -> Suite:
    """``n`` tasks generated from ``seed``; disjoint seeds give disjoint task ids.

    ``level`` 2 (default): multi-step problems; level 1: one operation on two numbers.
    ``format_reward``: partial credit for submitting a number computed with the calculator from the
    problem's quantities, when it is not the right answer (see ``CalcEnv.evaluate``); 0 keeps the
    reward exact-match only.
    """
    if not 0.0 <= format_reward < 1.0:
        raise ValueError(f"format_reward must be in [0, 1), got {format_reward}")
    if level not in (1, 2):
        raise ValueError(f"calc level must be 1 or 2, got {level}")
    rng = random.Random(seed)
    kind = "multi-step" if level == 2 else "one-step"
    if not 0 <= shots <= len(_DEMOS):
        raise ValueError(f"shots must be 0 to {len(_DEMOS)}, got {shots}")
    defaults: dict[str, Any] = {"shots": shots} | ({"level": 1} if level == 1 else {})
    defaults |= {"format_reward": format_reward} if format_reward else {}
    manifest = SuiteManifest(
        name=name, version="1", env_id="calc-v1", kind="calc", reward="exact_match",
        description=f"{n} {kind} arithmetic word problems (seed {seed})", defaults=defaults,
    )  # fmt: skip
    prefix = "calc" if level == 2 else "calc1"
    return Suite(manifest, tuple(make_calc_task(rng, f"{prefix}-{seed}-{i}", level) for i in range(n)))


def demonstration(shots: int = 1, level: int = 2) -> list[Message]:
    """``shots`` worked examples of the call-and-answer exchange, the one closest to ``level`` first."""
    demos = _DEMOS if level == 2 else _DEMOS[::-1]
    out: list[Message] = []
    for question, expression, value in demos[:shots]:
        out += [
            Message(role="user", content=question),
            Message.calling("calculator", expression=expression),
            Message(role="tool", name="calculator", content=value),
            Message.calling("answer", value=value),
            Message(role="tool", name="answer", content="submitted"),
        ]
    return out


class CalcEnv(NumberAnswerEnv):
    """Task: a CalcTask dict. Config: ``shots`` worked examples in the prompt (0 to 2), ``level``
    (which example comes first) and
    ``format_reward`` (default 0): the reward of an episode that computed its answer with the
    calculator from the problem's quantities but missed."""

    task_model = CalcTask
    solution = ("expression", "calculator", "expression")

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        t = CalcTask.model_validate(task)
        self.expected, self.submitted, self.calculated = t.answer, None, False
        self.known = _numbers_in(t.question)  # quantities an expression may combine
        self.computed: list[str] = []  # results of calculator calls that combined known quantities
        messages = [Message(role="system", content=SYSTEM)]
        messages += demonstration(self.settings.shots, self.settings.level)
        messages.append(Message(role="user", content=t.question))
        return self.observation(messages)

    @tool
    async def calculator(self, expression: str) -> str:
        """Evaluates an arithmetic expression with + - * / // % ** and parentheses.

        Args:
            expression: for example "12 * (3 + 4)".
        """
        value = _fmt(safe_eval(expression))
        self.calculated = True
        operands = [Decimal(m).normalize() for m in _NUMBER.findall(expression)]
        if len(operands) >= 2 and all(x in self.known for x in operands):
            self.computed.append(value)
        self.known |= _numbers_in(value)  # a multi-step solution builds on earlier results
        return value

    async def evaluate(self) -> RewardResult:
        # Used: a calculator call combined the problem's quantities; grounded: its result was submitted.
        return self.grade(used=bool(self.computed), results=self.computed, calculated=self.calculated)
