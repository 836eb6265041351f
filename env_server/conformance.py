"""Conformance checker: the contract every registered environment must keep (``pqrl env check ID``).

The test suite runs it over every registered environment. It drives the environment through the
same SessionManager the server uses, so a sandboxed environment is checked with a real sandbox.
Each rule is recorded as passed or failed in a ``ConformanceReport``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from env_server.environment import ToolEnvironment
from env_server.registry import EnvSpec, spec
from env_server.sessions import GraderFailure, SessionDone, SessionManager
from env_server.types import ToolCall, ToolStatus

__all__ = [
    "ConformanceError",
    "ConformanceReport",
    "Rule",
    "check_environment",
    "scripted_episodes",
    "unsafe_line",
    "worked_calls",
    "worked_problems",
]


@dataclass(frozen=True)
class Rule:
    name: str
    passed: bool
    detail: str = ""
    skipped: bool = False

    def __str__(self) -> str:
        mark = "skip" if self.skipped else "pass" if self.passed else "FAIL"
        return f"{mark}  {self.name}" + (f": {self.detail}" if self.detail else "")


@dataclass
class ConformanceReport:
    """Every rule checked on one environment, in order."""

    env_id: str
    rules: list[Rule] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.passed for r in self.rules)

    @property
    def problems(self) -> list[str]:
        """``rule: detail`` of each failed rule."""
        return [f"{r.name}: {r.detail}" if r.detail else r.name for r in self.rules if not r.passed]

    def check(self, name: str, problems: list[str] | str | None = None) -> None:
        """Records ``name`` as passed when there are no problems, else one failure per problem."""
        found = [problems] if isinstance(problems, str) else (problems or [])
        if not found:
            self.rules.append(Rule(name, True))
        for p in found:
            self.rules.append(Rule(name, False, p))

    def skip(self, name: str, why: str) -> None:
        self.rules.append(Rule(name, True, why, skipped=True))


class ConformanceError(AssertionError):
    """Lists every broken rule of one environment."""

    def __init__(self, env_id: str, problems: list[str], report: ConformanceReport | None = None) -> None:
        super().__init__(f"{env_id} breaks the environment contract:\n- " + "\n- ".join(problems))
        self.problems = problems
        self.report = report


def worked_calls(s: EnvSpec, cls: type[ToolEnvironment]) -> list[ToolCall] | None:
    """The calls of a correct episode of the spec's sample task: the registration's, else the class's."""
    if s.example_calls is not None:
        return [ToolCall(name=c["name"], arguments=dict(c.get("arguments", {})), id=f"w{i}")
                for i, c in enumerate(s.example_calls)]  # fmt: skip
    return cls.worked_example(dict(s.sample_task))


async def check_environment(
    env_id: str, *, manager: SessionManager | None = None, seed: int = 0, raise_on_failure: bool = True
) -> ConformanceReport:
    """The report of every rule ``env_id`` was checked against; raises ConformanceError naming the
    broken ones unless ``raise_on_failure`` is False.

    Rules: the class loads and its tool schemas are valid JSON Schema with unique names; reset
    gives at least one message and exactly the class's tools; invalid arguments and unknown
    tools become tool messages whose status is not ``ok`` (one per call, ids kept), not
    exceptions; evaluate gives a finite reward without raising; a final tool ends the episode and
    a later step is refused; with ``deterministic`` set, the same task and seed give the same first
    observation; the worked example (a correct episode) earns reward 1 and an episode without a
    call earns 0.
    """
    s = spec(env_id)
    report = ConformanceReport(env_id)
    try:
        cls = s.load()
    except (ImportError, TypeError) as e:
        report.check("class loads", str(e))
        return _done(report, raise_on_failure)
    report.check("class loads")
    schemas = cls.tool_schemas()
    names = [t["function"]["name"] for t in schemas]
    report.check(
        "unique tool names", [] if len(set(names)) == len(names) else f"duplicate tool names {names}"
    )
    bad_schema = []
    for schema in schemas:
        try:
            Draft202012Validator.check_schema(schema["function"]["parameters"])
        except SchemaError as e:
            bad_schema.append(f"tool {schema['function']['name']}: invalid JSON schema: {e.message}")
        if not schema["function"].get("description"):
            bad_schema.append(f"tool {schema['function']['name']} has no description")
    report.check("tool schemas valid and described", bad_schema)
    try:
        s.load_task_model()
        report.check("task model has id and kind")
    except (ImportError, TypeError) as e:
        report.check("task model has id and kind", str(e))
    own = manager is None
    manager = manager or SessionManager(pool_size=0)
    try:
        for phase in (
            _session_rules(report, manager, s, cls, names, seed),
            _worked_example(report, manager, s, cls, seed),
        ):
            try:
                await phase
            except Exception as e:  # the environment's own failure is a broken rule, not a crash
                report.check("episodes run without an environment error", f"{type(e).__name__}: {e}")
    finally:
        if own:
            await manager.shutdown()
    return _done(report, raise_on_failure)


def _done(report: ConformanceReport, raise_on_failure: bool) -> ConformanceReport:
    if raise_on_failure and not report.ok:
        raise ConformanceError(report.env_id, report.problems, report)
    return report


async def _session_rules(
    report: ConformanceReport, manager: SessionManager, s: EnvSpec, cls: type[ToolEnvironment],
    names: list[str], seed: int,
) -> None:  # fmt: skip
    task: dict[str, Any] = dict(s.sample_task)
    first = await manager.create(s.id, task, seed)
    report.check("reset gives messages", [] if first.observation.messages else "reset returned no messages")
    same = first.observation.tools == cls.tool_schemas()
    report.check(
        "reset gives the class's tools", [] if same else "reset's tools differ from the class's tool schemas"
    )
    calls = [ToolCall(name="no_such_tool_xyz", arguments={}, id="c1")]
    calls += [
        ToolCall(name=n, arguments={"no_such_argument_xyz": 1}, id=f"c{i + 2}") for i, n in enumerate(names)
    ]
    result = await manager.step(first.session_id, calls)
    replies = (
        []
        if len(result.messages) == len(calls)
        else [f"{len(calls)} calls gave {len(result.messages)} tool messages"]
    )
    invalid = []
    for call, msg in zip(calls, result.messages, strict=False):
        if msg.role != "tool" or msg.tool_call_id != call.id:
            replies.append(f"reply to {call.name} is not a tool message with id {call.id}")
        if msg.status is ToolStatus.OK:
            invalid.append(f"invalid call to {call.name} was answered as a success: {msg.content[:80]!r}")
    report.check("one tool message per call, ids kept", replies)
    report.check("invalid calls are not answered ok", invalid)
    try:  # the manager refuses a non-finite reward or info it cannot send, as a grader failure
        await manager.evaluate(first.session_id)
        report.check("evaluate gives a finite reward")
    except GraderFailure as e:
        cause = e.__cause__ or e
        report.check("evaluate gives a finite reward", f"evaluate failed: {type(cause).__name__}: {cause}")
    final = [n for n, t in cls.tools.items() if t.final]
    required = cls.tools[final[0]].args_model.model_json_schema().get("required", []) if final else []
    if final and not result.done and not required:  # a final tool callable without arguments must end it
        end = await manager.step(first.session_id, [ToolCall(name=final[0], arguments={})])
        report.check(
            "a final tool ends the episode",
            [] if end.done else f"calling final tool {final[0]} did not end the episode",
        )
        if end.done:
            try:
                await manager.step(first.session_id, [ToolCall(name=final[0], arguments={})])
                report.check("no step after done", "a step after done was accepted")
            except SessionDone:
                report.check("no step after done")
    await manager.close(first.session_id)
    if cls.deterministic:
        a = await manager.create(s.id, task, seed)
        b = await manager.create(s.id, task, seed)
        differ = a.observation != b.observation
        report.check(
            "deterministic reset",
            "deterministic, but the same task and seed gave different observations" if differ else [],
        )
        await manager.close(a.session_id)
        await manager.close(b.session_id)


async def _worked_example(
    report: ConformanceReport, manager: SessionManager, s: EnvSpec, cls: type[ToolEnvironment], seed: int
) -> None:
    """The environment's correct episode earns the full reward (1) and an empty one earns 0."""
    try:
        calls = worked_calls(s, cls)
    except Exception as e:
        report.check(
            "worked example earns 1", f"the worked example could not be built: {type(e).__name__}: {e}"
        )
        return
    if calls is None:
        report.skip("worked example earns 1", "the environment gives no worked example")
        return
    worked, empty = await scripted_episodes(manager, s.id, dict(s.sample_task), calls, seed)
    report.check("worked example earns 1", worked)
    report.check("empty episode earns 0", empty)


async def scripted_episodes(
    manager: SessionManager, env_id: str, task: dict[str, Any], calls: list[ToolCall], seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
) -> tuple[list[str], list[str]]:  # fmt: skip
    """The problems of ``calls`` run as one episode of ``task`` (each call must be answered ok and
    the episode earn 1), and of an episode without a call (it must earn 0)."""
    session = await manager.create(env_id, task, seed, env_kwargs)
    problems = []
    try:
        for call in calls:
            step = await manager.step(session.session_id, [call])
            msg = step.messages[0]
            if msg.status is not ToolStatus.OK:
                problems.append(f"worked call {call.name} answered {msg.status.value}: {msg.content[:120]!r}")
        scored = await manager.evaluate(session.session_id)
        problems += worked_problems(scored.reward, scored.info)
    except GraderFailure as e:
        problems.append(f"evaluate failed: {e.__cause__ or e}")
    finally:
        await manager.close(session.session_id)
    empty = await manager.create(env_id, task, seed, env_kwargs)
    try:
        scored = await manager.evaluate(empty.session_id)
        zero = [] if scored.reward == 0.0 else [f"an episode without a call earned {scored.reward:g}, not 0"]
    except GraderFailure as e:
        zero = [f"evaluate failed: {e.__cause__ or e}"]
    finally:
        await manager.close(empty.session_id)
    return problems, zero


def worked_problems(reward: float, info: dict[str, Any]) -> list[str]:
    """What is wrong with a correct episode's reward, in lines: the reward's own ``reason`` first;
    the gold solution's failure, when the grader could not use it, once instead of per test."""
    problems: list[str] = []
    fallback = str(info.get("verdict_fallback") or "")
    gold_broken = fallback.startswith(_NO_GOLD)
    if gold_broken:  # the root cause: the reward and the unsafe tests follow from it
        why = re.sub(r"^task [^:\s]+: ", "", fallback[len(_NO_GOLD) :])  # the check names the task
        problems.append(f"the gold solution: {why[:500]}")
    elif reward != 1.0:
        why = info.get("reason") or str(info)[:200]
        problems.append(f"the correct episode earned {reward:g}, not 1: {str(why)[:500]}")
    unsafe = info.get("unsafe_fail_to_pass")
    if unsafe and not gold_broken:  # a forged outcome could earn the reward (tasks/repo/values.py)
        problems.append(unsafe_line(unsafe))
    return problems


_NO_GOLD = "no gold record: "


def unsafe_line(unsafe: dict[str, str]) -> str:
    """One line naming the FAIL_TO_PASS tests a forged outcome could pass, and the way forward."""
    whys = sorted(set(unsafe.values()))
    names = ", ".join(list(unsafe)[:3]) + (f" and {len(unsafe) - 3} more" if len(unsafe) > 3 else "")
    why = (
        whys[0][:300] if len(whys) == 1 else "; ".join(f"{t}: {w[:120]}" for t, w in list(unsafe.items())[:3])
    )
    return (
        f"FAIL_TO_PASS tests the verdict cannot judge safely ({names}): {why}; "
        'fix the tests to assert values with ==, or set the suite\'s defaults {"verdict": "junit"} '
        "to grade by pytest outcomes alone, which a submission can forge (docs/security.md)"
    )
