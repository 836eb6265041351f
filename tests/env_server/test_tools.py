"""``@tool``: JSON schemas from type hints, defaults and Google docstrings; argument validation;
and how ``ToolEnvironment.step`` turns bad calls into messages for the model."""

from __future__ import annotations

from typing import Any, Literal, Optional  # noqa: UP035  (Optional is under test)

import pytest

from env_server.environment import ToolEnvironment
from env_server.tools import tool
from env_server.types import Message, Observation, RewardResult, ToolCall, ToolStatus
from sandboxes.protocol import SandboxDied


class Library(ToolEnvironment):
    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.seen: list[dict[str, Any]] = []
        return self.observation([Message(role="user", content="Find it.")])

    @tool
    async def search(
        self,
        query: str,
        limit: int = 5,
        lang: Optional[str] = None,  # noqa: UP045
        tags: list[str] | None = None,
        mode: Literal["fast", "exact"] = "fast",
    ) -> str:
        """Searches the catalogue.

        Matches titles and authors.

        Args:
            query: words to look for.
            limit: at most this many hits.
            mode: how to match.
        """
        self.seen.append({"query": query, "limit": limit, "lang": lang, "tags": tags, "mode": mode})
        return f"{limit} hits"

    @tool(name="borrow", final=True)
    async def take_out(self, ids: list[int], days: float) -> str:
        """Borrows books."""
        return f"borrowed {ids} for {days:g} days"

    @tool
    async def ping(self) -> None:
        """Returns nothing."""

    @tool
    async def explode(self) -> str:
        """Always fails."""
        raise ValueError("boom")

    @tool
    async def lose_sandbox(self) -> str:
        """Fails like a dead container."""
        raise SandboxDied("container gone")

    async def evaluate(self) -> RewardResult:
        return RewardResult(reward=0.0)


SEARCH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Searches the catalogue. Matches titles and authors.",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "query": {"type": "string", "description": "words to look for."},
                "limit": {"type": "integer", "default": 5, "description": "at most this many hits."},
                "lang": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                "tags": {
                    "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                    "default": None,
                },
                "mode": {
                    "type": "string",
                    "enum": ["fast", "exact"],
                    "default": "fast",
                    "description": "how to match.",
                },  # fmt: skip
            },
            "required": ["query"],
        },
    },
}


def test_schema_comes_from_hints_defaults_and_docstring():
    assert Library.tools["search"].schema() == SEARCH_SCHEMA
    # made once per tool, handed out as a copy: what one caller changes the next does not see
    Library.tools["search"].schema()["function"]["parameters"]["properties"].clear()
    assert Library.tools["search"].schema() == SEARCH_SCHEMA


def test_list_and_float_parameters_are_required_without_defaults():
    assert Library.tools["borrow"].schema() == {
        "type": "function",
        "function": {
            "name": "borrow",
            "description": "Borrows books.",
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "ids": {"type": "array", "items": {"type": "integer"}},
                    "days": {"type": "number"},
                },
                "required": ["ids", "days"],
            },
        },
    }


def test_tool_without_parameters_has_an_empty_object_schema():
    params = Library.tools["ping"].schema()["function"]["parameters"]
    assert params == {"type": "object", "additionalProperties": False, "properties": {}}


def test_name_override_and_final_flag():
    spec = Library.tools["borrow"]
    assert (spec.name, spec.method_name, spec.final) == ("borrow", "take_out", True)
    assert not Library.tools["search"].final
    assert list(Library.tools) == ["search", "borrow", "ping", "explode", "lose_sandbox"]
    assert Library.tool_schemas()[0] == SEARCH_SCHEMA


def test_defaults_fill_missing_optional_arguments():
    assert Library.tools["search"].validate({"query": "dune"}) == {
        "query": "dune", "limit": 5, "lang": None, "tags": None, "mode": "fast",
    }  # fmt: skip
    full = {"query": "dune", "limit": 2, "lang": "en", "tags": ["sf"], "mode": "exact"}
    assert Library.tools["search"].validate(full) == full


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "invalid arguments for search: query: Field required"),
        ({"query": "a", "page": 2}, "invalid arguments for search: page: Extra inputs are not permitted"),
        (
            {"query": "a", "limit": "many"},
            "invalid arguments for search: limit: Input should be a valid integer",
        ),
        (
            {"query": "a", "mode": "slow"},
            "invalid arguments for search: mode: Input should be 'fast' or 'exact'",
        ),
        ({"query": "a", "tags": "sf"}, "invalid arguments for search: tags: Input should be a valid list"),
        ({"query": 3}, "invalid arguments for search: query: Input should be a valid string"),
    ],
)
def test_invalid_arguments_give_a_message_for_the_model(arguments, message):
    with pytest.raises(ValueError) as e:
        Library.tools["search"].validate(arguments)
    assert str(e.value).startswith(message), str(e.value)


def test_every_problem_is_named():
    with pytest.raises(ValueError) as e:
        Library.tools["borrow"].validate({"ids": [1, "x"], "weeks": 2})
    text = str(e.value)
    for part in ("ids.1: Input should be a valid integer", "days: Field required", "weeks: Extra inputs"):
        assert part in text, text


def test_lax_coercion_of_numeric_strings():
    # pydantic's lax mode: a numeric string is accepted where an int is expected
    assert Library.tools["search"].validate({"query": "a", "limit": "7"})["limit"] == 7


def test_missing_docstring_is_a_type_error_at_class_creation():
    with pytest.raises(TypeError, match=r"needs a docstring"):

        class NoDoc(ToolEnvironment):
            @tool
            async def act(self, x: int) -> str:
                return "x"


def test_missing_type_hint_is_a_type_error_at_class_creation():
    with pytest.raises(TypeError, match=r"parameter 'x' needs a type hint"):

        class NoHint(ToolEnvironment):
            @tool
            async def act(self, x) -> str:  # noqa: ANN001
                """Acts."""


def test_var_args_are_rejected():
    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs"):

        class VarArgs(ToolEnvironment):
            @tool
            async def act(self, **options: int) -> str:
                """Acts."""


def test_sync_function_is_rejected():
    with pytest.raises(TypeError, match=r"must be an async method"):

        class Sync(ToolEnvironment):
            @tool
            def act(self, x: int) -> str:
                """Acts."""
                return "x"


def test_inherited_tools_are_collected_and_overrides_replace_them():
    class Branch(Library):
        @tool
        async def ping(self, loud: bool = False) -> str:
            """Answers pong.

            Args:
                loud: shout it.
            """
            return "PONG" if loud else "pong"

        @tool
        async def renew(self, book: int) -> str:
            """Renews a book.

            Args:
                book: its id.
            """
            return "renewed"

    assert set(Branch.tools) == {"search", "borrow", "ping", "explode", "lose_sandbox", "renew"}
    assert Branch.tools["search"].schema() == SEARCH_SCHEMA
    assert "loud" in Branch.tools["ping"].schema()["function"]["parameters"]["properties"]
    assert set(Library.tools) == {"search", "borrow", "ping", "explode", "lose_sandbox"}, "the base changed"


# ---------------------------------------------------------------- ToolEnvironment.step


async def _library() -> Library:
    env = Library()
    await env.reset(task={})
    return env


async def test_step_runs_validated_calls_with_coerced_values():
    env = await _library()
    result = await env.step([ToolCall(name="search", arguments={"query": "dune", "limit": "3"}, id="a")])
    assert result.messages == [Message(role="tool", content="3 hits", name="search", tool_call_id="a")]
    assert env.seen == [{"query": "dune", "limit": 3, "lang": None, "tags": None, "mode": "fast"}]
    assert not result.done


async def test_bad_calls_become_error_messages_in_order():
    env = await _library()
    calls = [
        ToolCall(name="nope", id="1"),
        ToolCall(name="search", arguments={"query": "a", "limit": "many"}, id="2"),
        ToolCall(name="explode", id="3"),
        ToolCall(name="ping", id="4"),
    ]
    result = await env.step(calls)
    contents = [m.content for m in result.messages]
    assert [m.tool_call_id for m in result.messages] == ["1", "2", "3", "4"]
    assert [m.status for m in result.messages] == [
        ToolStatus.INVALID,
        ToolStatus.INVALID,
        ToolStatus.ERROR,
        ToolStatus.OK,
    ]
    assert (
        contents[0]
        == "Error: unknown tool 'nope'; available tools: search, borrow, ping, explode, lose_sandbox"
    )
    assert contents[1].startswith(
        "Error: invalid arguments for search: limit: Input should be a valid integer"
    )
    assert contents[2] == "Error: explode failed: ValueError: boom"
    assert contents[3] == "", "a tool returning None gives an empty message"
    assert env.seen == [], "an invalid call must not run the tool"


async def test_final_tool_ends_the_episode_only_when_it_succeeds():
    env = await _library()
    bad = await env.step([ToolCall(name="borrow", arguments={"ids": "x", "days": 1})])
    assert not bad.done, "a final tool called with invalid arguments must not end the episode"
    good = await env.step([ToolCall(name="borrow", arguments={"ids": [1, 2], "days": 7})])
    assert good.done and good.messages[0].content == "borrowed [1, 2] for 7 days"
    late = await env.step([ToolCall(name="ping")])
    assert late.messages[0].status is ToolStatus.SKIPPED and "was not run" in late.messages[0].content


async def test_sandbox_errors_propagate():
    env = await _library()
    with pytest.raises(SandboxDied, match="container gone"):
        await env.step([ToolCall(name="lose_sandbox")])


async def test_a_final_tool_named_done_works():
    class Task(ToolEnvironment):
        async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
            return self.observation([Message(role="user", content="Go.")])

        @tool(final=True)
        async def done(self) -> str:
            """Ends the episode."""
            return "bye"

        async def evaluate(self) -> RewardResult:
            return RewardResult(reward=0.0)

    env = Task()
    await env.reset(task={})
    result = await env.step([ToolCall(name="done")])
    assert result.messages[0].content == "bye", result.messages[0].content
    assert result.done


def test_tool_messages_carry_a_status_and_only_they():
    assert Message(role="tool", content="x").status is ToolStatus.OK
    assert Message(role="tool", content="x", status="timeout").status is ToolStatus.TIMEOUT
    assert Message(role="user", content="x").status is None
    with pytest.raises(ValueError, match="only tool messages carry a status"):
        Message(role="user", content="x", status="ok")


def test_the_wire_call_is_the_records_fields_but_its_outcome():
    from dataclasses import fields

    from env_server.types import ToolCallRequest
    from pqrl.tool_calls import OUTCOME_FIELDS

    sent = [f.name for f in fields(ToolCall) if f.name not in OUTCOME_FIELDS]
    assert list(ToolCallRequest.model_fields) == sent
    assert list(ToolCallRequest.model_fields) == ["name", "arguments", "id"]
    call = ToolCall("search", {"query": "dune"}, id="a")
    wire = ToolCallRequest.of(call)
    assert wire.model_dump() == {"name": "search", "arguments": {"query": "dune"}, "id": "a"}
    assert wire.to_call() == call and ToolCallRequest(name="ping").to_call() == ToolCall("ping")
    with pytest.raises(ValueError, match="at most 128 characters"):
        ToolCallRequest.of(ToolCall("n" * 129))
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        ToolCallRequest.model_validate({"name": "ping", "status": "ok"})  # an outcome is never sent
