"""Conformance checker: the contract every registered environment must keep.

The test suite runs it over every registered environment. It drives the environment through the
same SessionManager the server uses, so a sandboxed environment is checked with a real sandbox.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from env_server.registry import spec
from env_server.sessions import GraderFailure, SessionDone, SessionManager
from env_server.types import ToolCall, ToolStatus

__all__ = ["ConformanceError", "check_environment"]


class ConformanceError(AssertionError):
    """Lists every broken rule of one environment."""

    def __init__(self, env_id: str, problems: list[str]) -> None:
        super().__init__(f"{env_id} breaks the environment contract:\n- " + "\n- ".join(problems))
        self.problems = problems


async def check_environment(env_id: str, *, manager: SessionManager | None = None, seed: int = 0) -> None:
    """Raises ConformanceError naming every rule ``env_id`` breaks.

    Rules: the class loads and its tool schemas are valid JSON Schema with unique names; reset
    gives at least one message and exactly the class's tools; invalid arguments and unknown
    tools become tool messages whose status is not ``ok`` (one per call, ids kept), not
    exceptions; evaluate gives a finite reward without raising; a final tool ends the episode and
    a later step is refused; with ``deterministic`` set, the same task and seed give the same first
    observation.
    """
    s = spec(env_id)
    problems: list[str] = []
    cls = s.load()
    schemas = cls.tool_schemas()
    names = [t["function"]["name"] for t in schemas]
    if len(set(names)) != len(names):
        problems.append(f"duplicate tool names {names}")
    for schema in schemas:
        try:
            Draft202012Validator.check_schema(schema["function"]["parameters"])
        except SchemaError as e:
            problems.append(f"tool {schema['function']['name']}: invalid JSON schema: {e.message}")
        if not schema["function"].get("description"):
            problems.append(f"tool {schema['function']['name']} has no description")
    task: dict[str, Any] = dict(s.sample_task)
    own = manager is None
    manager = manager or SessionManager(pool_size=0)
    try:
        first = await manager.create(env_id, task, seed)
        if not first.observation.messages:
            problems.append("reset returned no messages")
        if first.observation.tools != schemas:
            problems.append("reset's tools differ from the class's tool schemas")
        calls = [ToolCall(name="no_such_tool_xyz", arguments={}, id="c1")]
        calls += [
            ToolCall(name=n, arguments={"no_such_argument_xyz": 1}, id=f"c{i + 2}")
            for i, n in enumerate(names)
        ]
        result = await manager.step(first.session_id, calls)
        if len(result.messages) != len(calls):
            problems.append(f"{len(calls)} calls gave {len(result.messages)} tool messages")
        for call, msg in zip(calls, result.messages, strict=False):
            if msg.role != "tool" or msg.tool_call_id != call.id:
                problems.append(f"reply to {call.name} is not a tool message with id {call.id}")
            if msg.status is ToolStatus.OK:
                problems.append(
                    f"invalid call to {call.name} was answered as a success: {msg.content[:80]!r}"
                )
        try:  # the manager refuses a non-finite reward or info it cannot send, as a grader failure
            await manager.evaluate(first.session_id)
        except GraderFailure as e:
            cause = e.__cause__ or e
            problems.append(f"evaluate failed: {type(cause).__name__}: {cause}")
        final = [n for n, t in cls.tools.items() if t.final]
        if final and not result.done:
            spec_final = cls.tools[final[0]]
            required = spec_final.args_model.model_json_schema().get("required", [])
            if not required:  # a final tool callable without arguments must end the episode
                end = await manager.step(first.session_id, [ToolCall(name=final[0], arguments={})])
                if not end.done:
                    problems.append(f"calling final tool {final[0]} did not end the episode")
                else:
                    try:
                        await manager.step(first.session_id, [ToolCall(name=final[0], arguments={})])
                        problems.append("a step after done was accepted")
                    except SessionDone:
                        pass
        await manager.close(first.session_id)
        if cls.deterministic:
            a = await manager.create(env_id, task, seed)
            b = await manager.create(env_id, task, seed)
            if a.observation != b.observation:
                problems.append("deterministic, but the same task and seed gave different observations")
            await manager.close(a.session_id)
            await manager.close(b.session_id)
    finally:
        if own:
            await manager.shutdown()
    if problems:
        raise ConformanceError(env_id, problems)
