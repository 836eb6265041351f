"""The search suite: a generated corpus, a real BM25 index, gold answers score 1."""

from __future__ import annotations

import pytest

from env_server.client import LocalEnvClient
from env_server.conformance import check_environment
from env_server.types import ToolCall
from tasks.search import search_suite

SUITE = search_suite(30, seed=5)
KWARGS = {"corpus": SUITE.manifest.defaults["corpus"]}


def test_generation_is_deterministic_with_single_and_multi_hop_questions():
    assert search_suite(30, seed=5) == SUITE
    assert {t.hops for t in SUITE.tasks} == {1, 2}
    assert len({t.question for t in SUITE.tasks}) == 30
    titles = [d["title"] for d in KWARGS["corpus"]]
    assert len(titles) == len(set(titles)), "entity names are unique"


@pytest.fixture
async def client():
    c = LocalEnvClient()
    yield c
    await c.aclose()


@pytest.mark.parametrize("task", SUITE.tasks[:12], ids=[t.id for t in SUITE.tasks[:12]])
async def test_gold_scores_one_and_wrong_or_missing_scores_zero(client, task):
    s = await client.create_session("search-v1", task.model_dump(), env_kwargs=KWARGS)
    await client.step(s.session_id, [ToolCall(name="answer", arguments={"text": f"The {task.answers[0]}."})])
    result = await client.evaluate(s.session_id)
    assert result.reward == 1.0 and result.info["f1"] == 1.0
    wrong = await client.create_session("search-v1", task.model_dump(), env_kwargs=KWARGS)
    await client.step(wrong.session_id, [ToolCall(name="answer", arguments={"text": "Nowhere Atall"})])
    assert (await client.evaluate(wrong.session_id)).reward == 0.0
    silent = await client.create_session("search-v1", task.model_dump(), env_kwargs=KWARGS)
    assert (await client.evaluate(silent.session_id)).reward == 0.0


async def test_search_finds_the_entity_a_single_hop_question_names(client):
    hits = 0
    single = [t for t in SUITE.tasks if t.hops == 1]
    for task in single:
        s = await client.create_session("search-v1", task.model_dump(), env_kwargs=KWARGS)
        # The entity's name is the question's capitalised words; search for the whole question.
        out = await client.step(
            s.session_id, [ToolCall(name="search", arguments={"query": task.question, "k": 3})]
        )
        hits += task.answers[0] in out.messages[0].content
    assert hits / len(single) >= 0.8, f"BM25 put the answer in the top 3 for {hits}/{len(single)} questions"


async def test_search_arguments_are_validated(client):
    s = await client.create_session("search-v1", SUITE.tasks[0].model_dump(), env_kwargs=KWARGS)
    out = await client.step(s.session_id, [ToolCall(name="search", arguments={"query": "x", "k": 99})])
    assert out.messages[0].content.startswith("Error: invalid arguments for search: k:")
    out = await client.step(s.session_id, [ToolCall(name="search", arguments={"query": "the of and"})])
    assert "No results" in out.messages[0].content


async def test_search_env_conforms():
    await check_environment("search-v1")


async def test_worked_examples_precede_the_question_and_name_no_entity_of_the_corpus(client):
    shown = search_suite(30, seed=5, shots=2)
    assert shown.manifest.defaults["shots"] == 2 and shown.tasks == SUITE.tasks
    task = shown.tasks[0]
    s = await client.create_session("search-v1", task.model_dump(), env_kwargs=shown.manifest.defaults)
    roles = [m.role for m in s.observation.messages]
    # system, then per example: question, one search per hop, the answer; then the question
    one_hop, two_hop = ["user", *["assistant", "tool"] * 2], ["user", *["assistant", "tool"] * 3]
    assert roles == ["system", *one_hop, *two_hop, "user"]
    assert s.observation.messages[-1].content == task.question
    demo_text = " ".join(m.content for m in s.observation.messages[1:-1])
    assert not any(d["title"] in demo_text for d in KWARGS["corpus"])
    with pytest.raises(ValueError):
        search_suite(3, shots=3)


async def test_evidence_credit_needs_a_search_that_found_the_answer(client):
    """format_reward: a wrong answer earns half for a search that returned the answer, half for
    submitting words that a search returned; a guess without searching, or searching without
    answering, earns nothing."""
    shaped = search_suite(30, seed=5, format_reward=0.2)
    assert shaped.tasks == SUITE.tasks and shaped.manifest.defaults["format_reward"] == 0.2
    kwargs = shaped.manifest.defaults
    task = next(t for t in shaped.tasks if t.hops == 1 and "born" in t.question)
    entity = task.question.removeprefix("In which city was ").removesuffix(" born?")

    async def reward(*calls: tuple[str, dict]) -> tuple[float, dict]:
        s = await client.create_session("search-v1", task.model_dump(), env_kwargs=kwargs)
        for name, arguments in calls:
            await client.step(s.session_id, [ToolCall(name=name, arguments=arguments)])
        r = await client.evaluate(s.session_id)
        return r.reward, r.info

    look = ("search", {"query": entity, "k": 1})
    assert (await reward(look, ("answer", {"text": task.answers[0]})))[0] == 1.0
    # found the article, then answered with its profession: words it returned, but wrong
    r, info = await reward(look, ("answer", {"text": "was"}))
    assert (r, info["found"], info["grounded"]) == (pytest.approx(0.2), True, True)
    r, info = await reward(look, ("answer", {"text": "Nowhere Atall"}))
    assert (r, info["found"], info["grounded"]) == (pytest.approx(0.1), True, False)
    # a guess without a search, a search that missed followed by an invented answer, and a search
    # that found the answer but no answer at all
    assert (await reward(("answer", {"text": task.answers[0] + "x"})))[0] == 0.0
    assert (await reward(look))[0] == 0.0
    assert (await reward(("search", {"query": "zzqx"}), ("answer", {"text": "Nowhere"})))[0] == 0.0
    # the same episodes without the option score 0
    s = await client.create_session("search-v1", task.model_dump(), env_kwargs=KWARGS)
    await client.step(s.session_id, [ToolCall(name="search", arguments={"query": entity})])
    await client.step(s.session_id, [ToolCall(name="answer", arguments={"text": "was"})])
    assert (await client.evaluate(s.session_id)).reward == 0.0
    with pytest.raises(ValueError, match="format_reward"):
        search_suite(3, format_reward=1.0)
