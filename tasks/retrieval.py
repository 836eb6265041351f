"""Where the search tool's articles come from: a ``Retriever``. ``LocalRetriever`` reads a bm25s
index (``tasks.corpus``); ``RemoteRetriever`` asks any server speaking Search-R1's retrieval API
(``POST /retrieve`` with ``{"queries", "topk", "return_scores"}``), such as a dense e5/FAISS server
or ``pqrl search serve``.

A remote failure (a timeout, an HTTP error, a reply that is not the API's shape) raises
``RetrieverError``: the search tool's call fails with that message, which the model sees, and the
episode goes on.
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.parse
from typing import Any, Protocol

import httpx
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pqrl.text import clipped
from tasks.corpus import (
    Document,
    Hit,
    LocalIndex,
    corpus_name_problem,
    open_corpus,
    query_words,
    split_contents,
)

__all__ = [
    "LocalRetriever",
    "RemoteRetriever",
    "Retriever",
    "RetrieverConfig",
    "RetrieverError",
    "retriever_for",
]

MAX_TOPK = 10  # the search tool's own bound on k
_MAX_REPLY_BYTES = 8 << 20
_DETAIL_CHARS = 200


class RetrieverError(Exception):
    """The retriever failed this query; the message says how, for the model and the log."""


class Retriever(Protocol):
    async def search(self, query: str, k: int) -> list[Hit]:
        """The best ``k`` (at most) articles for ``query``, best first."""
        ...

    async def aclose(self) -> None: ...


class LocalRetriever:
    """A bm25s index in this process; searched in a thread, so a large index does not hold up the
    event loop."""

    def __init__(self, index: LocalIndex) -> None:
        self.index = index

    async def search(self, query: str, k: int) -> list[Hit]:
        return (await asyncio.to_thread(self.index.search, [query], k))[0]

    async def aclose(self) -> None:
        pass


class RemoteRetriever:
    """A Search-R1 retrieval server at ``url`` (its base, or the ``/retrieve`` endpoint itself).
    Every query is bounded by ``timeout_s`` in all and its reply by 8 MiB."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        base = url.rstrip("/")
        self.url = base if base.endswith("/retrieve") else f"{base}/retrieve"
        self.timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None

    async def search(self, query: str, k: int) -> list[Hit]:
        try:
            status, body = await asyncio.wait_for(self._post(query, k), self.timeout_s)
        except (TimeoutError, httpx.TimeoutException):
            raise RetrieverError(f"the retriever did not answer within {self.timeout_s:g}s") from None
        except httpx.HTTPError as e:
            raise RetrieverError(f"the retriever is unreachable: {type(e).__name__}: {e}") from None
        if status != 200:
            detail = body.decode("utf-8", "replace")
            raise RetrieverError(f"the retriever answered HTTP {status}: {clipped(detail, _DETAIL_CHARS)}")
        return _hits(body, k)

    async def _post(self, query: str, k: int) -> tuple[int, bytes]:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        payload = {"queries": [query], "topk": k, "return_scores": True}
        async with self._client.stream("POST", self.url, json=payload) as r:
            body = bytearray()
            async for chunk in r.aiter_bytes():
                body += chunk
                if len(body) > _MAX_REPLY_BYTES:
                    raise RetrieverError(f"the retriever's reply exceeds {_MAX_REPLY_BYTES >> 20} MiB")
            return r.status_code, bytes(body)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _bad(why: str) -> RetrieverError:
    return RetrieverError(f"the retriever's reply is not Search-R1's /retrieve answer: {why}")


def _hits(body: bytes, k: int) -> list[Hit]:
    """``{"result": [[{"document": {...}, "score": s} | {...document...}, ...]]}``, the first
    ``k`` entries; a document is ``{"id", "contents": '"Title"\\ntext'}`` or has ``title``/``text``."""
    try:
        reply = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        raise _bad(f"not JSON: {clipped(body.decode('utf-8', 'replace'), _DETAIL_CHARS)!r}") from None
    result = reply.get("result") if isinstance(reply, dict) else None
    if not isinstance(result, list) or len(result) != 1 or not isinstance(result[0], list):
        raise _bad('no "result" list with one list per query')
    hits = []
    for n, entry in enumerate(result[0][:k]):
        where = f"result[0][{n}]"
        if not isinstance(entry, dict):
            raise _bad(f"{where} is not an object")
        doc, score = (entry.get("document"), entry.get("score", 0.0)) if "document" in entry else (entry, 0.0)
        if not isinstance(score, int | float) or isinstance(score, bool) or not math.isfinite(score):
            raise _bad(f"{where}.score is not a finite number")
        hits.append(_hit(doc, float(score), where))
    return hits


def _hit(doc: Any, score: float, where: str) -> Hit:
    if not isinstance(doc, dict):
        raise _bad(f"{where}.document is not an object")
    title, text = doc.get("title", ""), doc.get("text")
    if text is None and isinstance(doc.get("contents"), str):
        head, text = split_contents(doc["contents"])
        title = head or title
    if not isinstance(text, str) or not isinstance(title, str):
        raise _bad(f"{where} has no text (a string contents, or title and text)")
    return Hit(str(doc.get("id", "")), title, text, score)


def _http_url(url: str) -> bool:
    """Whether ``url`` can be asked at all: http(s), a host, a port from 1 to 65535, no blank or
    control character (what a request could only fail on, search after search)."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return False
    try:
        parsed, port = httpx.URL(url), urllib.parse.urlsplit(url).port
    except (httpx.InvalidURL, TypeError, ValueError):  # ValueError: a port out of range
        return False
    return parsed.scheme in ("http", "https") and bool(parsed.host) and port != 0


_DOCUMENTS = TypeAdapter(list[Document])


def _documents(value: Any) -> list[Document]:
    """Inline documents by Document's rule, then unique ids and a word to search for (what
    indexing them would refuse), each error at its path (``N.id``)."""
    docs: list[Document] = _DOCUMENTS.validate_python(value)
    first: dict[str, int] = {}
    errors: list[Any] = []
    for n, doc in enumerate(docs):
        if doc.id in first:
            why = PydanticCustomError("duplicate_id", "duplicate id {id} (first at corpus.{first})",
                                      {"id": clipped(repr(doc.id), 80), "first": first[doc.id]})  # fmt: skip
            errors.append({"type": why, "loc": (n, "id"), "input": doc.id})
        first.setdefault(doc.id, n)
    if errors:
        raise ValidationError.from_exception_data("corpus", errors)
    if docs and not any(query_words(f"{d.title} {d.text}") for d in docs):
        raise ValueError("no document has a word to search for (all are stopwords or punctuation)")
    return docs


class RetrieverConfig(BaseModel):
    """Where the search tool reads: the settings ``retriever_for`` takes, each checked here so that
    a suite ``pqrl tasks validate`` accepts cannot fail at reset on them."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    corpus: list[Document] | str | None = Field(
        None, description="inline documents, a JSONL file or sha256:<digest> of an indexed one"
    )
    retriever_url: str | None = Field(None, description="a Search-R1 retrieval server; wins over corpus")
    retriever_timeout: float = Field(
        10.0, gt=0, le=300, strict=True, description="seconds a remote search may take"
    )
    retriever_topk: int = Field(
        MAX_TOPK, ge=1, le=MAX_TOPK, strict=True, description="most articles a search returns"
    )

    @field_validator("corpus", mode="wrap")
    @classmethod
    def _corpus(cls, value: Any, handler: Any) -> Any:
        # documents or a name, told apart here: a union would put its member's name in an error's
        # path (corpus.list[Document].3.text instead of corpus.3.text)
        if value is None:
            return None
        if isinstance(value, str):
            problem = corpus_name_problem(value)
            if problem is not None:
                raise ValueError(problem)
            return value
        if not isinstance(value, list):
            kind = type(value).__name__
            raise ValueError(f"a list of documents, a JSONL path or sha256:<digest>, not {kind}")
        return _documents(value)

    @field_validator("retriever_url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is not None and not _http_url(url):
            raise ValueError(f"not an http(s) URL with a host: {clipped(repr(url), 200)}")
        return url

    @model_validator(mode="after")
    def _a_source(self) -> RetrieverConfig:
        if self.retriever_url is None and not self.corpus:
            raise ValueError("give a corpus (documents, a JSONL file or sha256:<digest>) or a retriever_url")
        return self


def retriever_for(config: RetrieverConfig) -> tuple[Retriever, int]:
    """(the retriever ``config`` names, the most articles one search returns).

    ``retriever_url`` (with ``retriever_timeout`` seconds) names a remote server and wins over
    ``corpus``; otherwise ``corpus`` is read locally (``tasks.corpus.open_corpus``: a file is
    indexed on first use, which may still fail here: it is looked for on this machine)."""
    if config.retriever_url is not None:
        return RemoteRetriever(config.retriever_url, config.retriever_timeout), config.retriever_topk
    corpus = config.corpus
    spec = [d.model_dump() for d in corpus] if isinstance(corpus, list) else corpus
    return LocalRetriever(open_corpus(spec)), config.retriever_topk
