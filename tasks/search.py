"""The search suite: an offline corpus of fictional entities, single- and multi-hop questions, a
BM25 ``search`` tool and an ``answer`` tool, scored by SQuAD-normalised exact match (F1 in info).

Every entity is invented from a seed, so no answer can come from a model's memory: it has to be
found. A suite names its corpus in the manifest's ``defaults["corpus"]``: inline, a list of
``{"id", "title", "text"}`` (as the generated suite does), or a JSONL file of them indexed once
(``tasks.corpus``); or it names a retrieval server instead (``defaults["retriever_url"]``, any
server speaking Search-R1's API, see ``tasks.retrieval``).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from env_server import Message, RewardResult, ToolEnvironment, tool
from env_server.types import Observation, ToolCall
from pqrl.text import clipped
from tasks.corpus import query_words
from tasks.graders import normalize_answer, qa_score, shaped_reward
from tasks.retrieval import Retriever, RetrieverConfig, retriever_for
from tasks.suite import QATask, Suite, SuiteManifest

__all__ = ["SearchEnv", "make_corpus", "search_suite"]

SYSTEM = (
    "You answer questions about a private encyclopedia that only the search tool can read.\n"
    "Tools:\n"
    '- search: finds articles. Arguments: {"query": "words to look for", "k": 3}\n'
    '- answer: gives the final answer (a few words) and ends the task. Arguments: {"text": "..."}\n'
    "Search before answering; a question may need two searches."
)

_SYLLABLES = [
    "ka", "lo", "mi", "ran", "te", "vo", "zel", "qua", "dor", "ith", "bar", "nue", "sa", "fen",
    "gor", "pri", "wy", "tal", "om", "rex", "ul", "che", "va", "mor", "kin", "ess", "lu", "dra",
]  # fmt: skip
_PROFESSIONS = [
    "astronomer",
    "glassblower",
    "cartographer",
    "composer",
    "botanist",
    "engineer",
    "poet",
    "chemist",
]
_PRODUCTS = ["lanterns", "clockwork birds", "salt bricks", "river barges", "silk maps", "copper bells"]


def _name(rng: random.Random, used: set[str], parts: int) -> str:
    while True:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()
        if name not in used and len(name) > 3:
            used.add(name)
            return name


@dataclass
class _World:
    cities: list[dict[str, Any]]
    people: list[dict[str, Any]]
    companies: list[dict[str, Any]]


def _world(rng: random.Random, n_cities: int, n_people: int, n_companies: int) -> _World:
    used: set[str] = set()
    rivers = [_name(rng, used, 2) for _ in range(max(3, n_cities // 2))]
    cities = [
        {"name": _name(rng, used, 3), "river": rng.choice(rivers), "population": rng.randint(2, 900) * 1000}
        for _ in range(n_cities)
    ]
    people = [{"name": f"{_name(rng, used, 2)} {_name(rng, used, 3)}", "born": rng.randint(1700, 1990),
               "city": rng.choice(cities)["name"], "profession": rng.choice(_PROFESSIONS)}
              for _ in range(n_people)]  # fmt: skip
    companies = [{"name": f"{_name(rng, used, 3)} Works", "founded": rng.randint(1750, 2010),
                  "founder": rng.choice(people)["name"], "hq": rng.choice(cities)["name"],
                  "product": rng.choice(_PRODUCTS)} for _ in range(n_companies)]  # fmt: skip
    return _World(cities, people, companies)


def make_corpus(world: _World) -> list[dict[str, str]]:
    docs = []
    for c in world.cities:
        text = (
            f"{c['name']} is a city on the river {c['river']}. It has about {c['population']:,} inhabitants."
        )
        docs.append({"id": f"city-{c['name']}", "title": c["name"], "text": text})
    for p in world.people:
        text = f"{p['name']} was a {p['profession']} born in {p['born']} in the city of {p['city']}."
        docs.append({"id": f"person-{p['name']}", "title": p["name"], "text": text})
    for c in world.companies:
        text = (f"{c['name']} is a maker of {c['product']} founded in {c['founded']} by {c['founder']}. "
                f"Its headquarters are in {c['hq']}.")  # fmt: skip
        docs.append({"id": f"company-{c['name']}", "title": c["name"], "text": text})
    return docs


def _question(rng: random.Random, world: _World) -> tuple[str, str, int]:
    """(question, answer, hops) of a random kind."""
    by_city = {c["name"]: c for c in world.cities}
    by_person = {p["name"]: p for p in world.people}
    p, c, co = rng.choice(world.people), rng.choice(world.cities), rng.choice(world.companies)
    founder, hq = by_person[co["founder"]], by_city[co["hq"]]
    kinds = [
        (f"In which city was {p['name']} born?", p["city"], 1),
        (f"In what year was {co['name']} founded?", str(co["founded"]), 1),
        (f"Which river flows through {c['name']}?", c["river"], 1),
        (f"In which city was the founder of {co['name']} born?", founder["city"], 2),
        (f"Which river flows through the city where {co['name']} has its headquarters?", hq["river"], 2),
        (f"What was the profession of the founder of {co['name']}?", founder["profession"], 2),
    ]
    return kinds[rng.randrange(len(kinds))]


def _questions(rng: random.Random, world: _World, n: int, seed: int) -> list[QATask]:
    tasks, seen = [], set()
    while len(tasks) < n:
        question, answer, hops = _question(rng, world)
        if question not in seen:
            seen.add(question)
            tasks.append(
                QATask(id=f"search-{seed}-{len(tasks)}", question=question, answers=[answer], hops=hops)
            )
    return tasks


def search_suite(
    n: int = 200, seed: int = 0, *, name: str = "search", shots: int = 0, format_reward: float = 0.0
) -> Suite:
    """``n`` questions over a corpus of about ``n`` fictional entities generated from ``seed``;
    ``shots`` worked examples (0 to 2) in each prompt; ``format_reward``: partial credit, when the
    answer is wrong, for having found the evidence (see ``SearchEnv.evaluate``)."""
    if not 0 <= shots <= len(_DEMOS):
        raise ValueError(f"shots must be 0 to {len(_DEMOS)}, got {shots}")
    if not 0.0 <= format_reward < 1.0:
        raise ValueError(f"format_reward must be in [0, 1), got {format_reward}")
    rng = random.Random(seed)
    world = _world(rng, n_cities=max(8, n // 4), n_people=max(12, n // 2), n_companies=max(8, n // 4))
    manifest = SuiteManifest(
        name=name, version="1", env_id="search-v1", kind="qa", reward="qa_em_f1",
        description=f"{n} single- and multi-hop questions over a generated corpus (seed {seed})",
        defaults={"corpus": make_corpus(world)} | ({"shots": shots} if shots else {})
        | ({"format_reward": format_reward} if format_reward else {}),
    )  # fmt: skip
    return Suite(manifest, tuple(_questions(rng, world, n, seed)))


# Worked examples shown as earlier turns, about entities that are in no corpus: (question, then the
# (query, what search returned) steps, then the answer). A one-hop and a two-hop question.
_DEMOS = (
    ("In which city was Toma Velkaran born?",
     (("Toma Velkaran", "[1] Toma Velkaran: Toma Velkaran was a botanist born in 1802 in the city of "
                        "Morlessa."),),
     "Morlessa"),
    ("Which river flows through the city where Quarido Works has its headquarters?",
     (("Quarido Works", "[1] Quarido Works: Quarido Works is a maker of copper bells founded in 1911 by Ena "
                        "Dorsal. Its headquarters are in Vestrane."),
      ("Vestrane", "[1] Vestrane: Vestrane is a city on the river Olwen. It has about 52,000 inhabitants.")),
     "Olwen"),
)  # fmt: skip


def demonstration(shots: int) -> list[Message]:
    """``shots`` worked search-and-answer exchanges."""
    out: list[Message] = []
    for question, steps, answer in _DEMOS[:shots]:
        out.append(Message(role="user", content=question))
        for query, found in steps:
            out += [Message.calling("search", query=query),
                    Message(role="tool", name="search", content=found)]  # fmt: skip
        out += [Message.calling("answer", text=answer),
                Message(role="tool", name="answer", content="submitted")]  # fmt: skip
    return out


def _mentions(text: str, phrase: str) -> bool:
    """Whether ``phrase`` occurs in ``text`` as whole words, after QA normalisation."""
    needle = normalize_answer(phrase)
    return bool(needle) and f" {needle} " in f" {normalize_answer(text)} "


_ARTICLE_CHARS = 2000  # of one article in a search's answer: a corpus may hold long documents


class SearchConfig(RetrieverConfig):
    """The keyword arguments of search-v1 (a suite's ``defaults``): where it reads
    (``RetrieverConfig``), worked examples and shaping."""

    shots: int = Field(0, ge=0, le=len(_DEMOS))
    format_reward: float = Field(0.0, ge=0, lt=1)


class SearchEnv(ToolEnvironment):
    """Task: a QATask dict. Config: where ``search`` reads (``corpus``: a list of documents, a
    JSONL file or ``sha256:<digest>`` of an indexed one; or ``retriever_url`` of a Search-R1
    retrieval server, with ``retriever_timeout``; ``retriever_topk`` caps ``k``, see
    ``tasks.retrieval.retriever_for``), ``shots`` worked examples in the prompt (default 0) and
    ``format_reward`` (default 0, see ``evaluate``)."""

    retriever: Retriever | None = None
    settings: SearchConfig

    task_model = QATask
    config_model = SearchConfig
    reward_names = ("qa_em_f1",)

    @classmethod
    def worked_example(cls, task: dict[str, Any]) -> list[ToolCall] | None:
        t = QATask.model_validate(task)
        return [ToolCall(name="search", arguments={"query": t.question}, id="w1"),
                ToolCall(name="answer", arguments={"text": t.answers[0]}, id="w2")]  # fmt: skip

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        t = QATask.model_validate(task)
        # a corpus file is hashed and indexed on first use: not on the event loop
        self.retriever, self.topk = await asyncio.to_thread(retriever_for, self.settings)
        self.references, self.submitted = t.answers, None
        self.found: list[str] = []  # what every search returned, for the evidence credit
        return self.observation(
            [
                Message(role="system", content=SYSTEM),
                *demonstration(self.settings.shots),
                Message(role="user", content=t.question),
            ]
        )

    @tool
    async def search(self, query: str, k: Annotated[int, Field(ge=1, le=10)] = 3) -> str:
        """Searches the encyclopedia and returns the best matching articles.

        Args:
            query: words to look for.
            k: how many articles to return (1 to 10).
        """
        if not query_words(query):
            return "No results: the query has no searchable words."
        assert self.retriever is not None, "reset first"
        hits = await self.retriever.search(query, min(k, self.topk))
        self.found += [h.text for h in hits]
        shown = (f"[{n + 1}] {h.title}: {clipped(h.text, _ARTICLE_CHARS)}" for n, h in enumerate(hits))
        return "\n".join(shown) or "No results."

    async def close(self) -> None:
        if self.retriever is not None:
            await self.retriever.aclose()

    @tool(final=True)
    async def answer(self, text: str) -> str:
        """Gives the final answer and ends the task.

        Args:
            text: the answer, in a few words.
        """
        self.submitted = text
        return "submitted"

    async def evaluate(self) -> RewardResult:
        """Exact match. A wrong answer may earn ``format_reward`` shaping, as in calc and data: half
        when a search returned an article naming the answer (the evidence was found), half when
        the submitted words occur in a returned article (copied, not invented). A guess made
        without searching earns nothing, and neither does an episode that never answers: crediting
        the search alone was gamed (the policy searched until its turns ran out)."""
        reward, info = qa_score(self.submitted, self.references)
        answered = self.submitted is not None
        found = answered and any(_mentions(text, ref) for text in self.found for ref in self.references)
        grounded = answered and any(_mentions(text, self.submitted) for text in self.found)
        reward = shaped_reward(reward, self.settings.format_reward, used=found, grounded=grounded)
        return RewardResult(
            reward=reward, info={**info, "submitted": self.submitted, "found": found, "grounded": grounded}
        )
