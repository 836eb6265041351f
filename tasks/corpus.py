"""A search corpus as a file: JSONL of ``{"id", "title", "text"}`` (Search-R1's ``{"id", "contents"}``
too), validated line by line, indexed once with bm25s and kept by the file's content hash under
``$PQRL_CACHE/corpora/<sha256>/``, then opened memory-mapped.

A file is hashed once: the digest is recorded beside the index with the file's path, size, mtime
and inode, and a later process (or reset) that finds them unchanged reuses it without reading the
file. An inline corpus (a list in the suite's defaults, as the generated suite carries) is indexed
in memory, once per process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from pqrl.cache import cache_dir
from pqrl.errors import UsageError
from pqrl.text import clipped

__all__ = [
    "CorpusError",
    "Document",
    "Hit",
    "LocalIndex",
    "build_index",
    "corpus_digest",
    "corpus_name_problem",
    "open_corpus",
    "query_words",
    "split_contents",
    "stats",
]

_MAX_ERRORS = 20  # listed per bad file; the rest are counted
_DIGEST = "sha256:"
stats: Counter[str] = Counter()  # "hashed", "built": what this process did (tests read it)
_LOCK = threading.Lock()  # one build or open at a time: concurrent resets wait for the first
_DIGESTS: dict[tuple[str, int, int, int], str] = {}
_OPEN: dict[str, LocalIndex] = {}
_INLINE: dict[str, LocalIndex] = {}


class CorpusError(UsageError, ValueError):
    """A corpus that cannot be used: every bad line with its number and field, or a missing file.
    A ``ValueError`` too, so a reset that meets one rejects the task instead of crashing."""


@dataclass(frozen=True)
class Hit:
    id: str
    title: str
    text: str
    score: float


@dataclass(frozen=True)
class _Unreadable:
    why: str


def split_contents(contents: str) -> tuple[str, str]:
    """(title, text) of Search-R1's ``contents``: ``'"Title"\\ntext'``, or text alone."""
    head, _, rest = contents.partition("\n")
    return (head.strip().strip('"'), rest) if rest.strip() else ("", contents)


class Document(BaseModel):
    """One article, the one rule for a corpus file's lines and a suite's inline documents: an ``id``
    (a non-blank string, or an integer read as its decimal string), a ``title`` (optional) and a
    non-blank ``text``; Search-R1's ``contents`` (``'"Title"\\ntext'``) stands for title and text.
    Other fields are kept and ignored. Ids are unique within a corpus (checked by its reader)."""

    model_config = ConfigDict(extra="allow", strict=True)
    id: str
    title: str = ""
    text: str

    @model_validator(mode="before")
    @classmethod
    def _forms(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        raw = dict(raw)
        for key in ("title", "text"):
            if key in raw and raw[key] is None:
                del raw[key]
        if "text" not in raw and isinstance(raw.get("contents"), str):
            head, raw["text"] = split_contents(raw["contents"])
            if head:
                raw["title"] = head
        return raw

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, value: Any) -> Any:
        """The one rule: a string, or an integer kept as its decimal string (``7`` and ``"7"`` are
        one id); any other JSON value (``1.5``, ``true``, ``null``) is refused, saying so."""
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            shown = (
                json.dumps(value)
                if isinstance(value, (float, bool)) or value is None
                else type(value).__name__
            )
            raise ValueError(f"an id is a non-empty string or an integer, not {shown}")
        return value

    @field_validator("id", "text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("not a non-empty string")
        return value


def _why(err: Any) -> str:
    """``field F: why`` of one of Document's errors, in a corpus file's words."""
    if not err["loc"]:
        return "not a JSON object"
    field = err["loc"][0]
    if err["type"] == "missing":
        why = "missing (every document needs its text)" if field == "text" else "missing"
    elif err["type"] == "string_type":
        why = "not a string" if field == "title" else "not a non-empty string"
    else:
        why = str(err["msg"]).removeprefix("Value error, ")
    return f"field {field}: {why}"


def _document(raw: Any, where: str) -> tuple[dict[str, str] | None, list[str]]:
    """(the normalised document, or None; the problems, each ``where: field F: why``)."""
    if isinstance(raw, _Unreadable):
        return None, [f"{where}: {raw.why}"]
    try:
        doc = Document.model_validate(raw)
    except ValidationError as e:
        return None, [f"{where}: {_why(err)}" for err in e.errors()]
    return {"id": doc.id, "title": doc.title, "text": doc.text}, []


def corpus_name_problem(spec: str) -> str | None:
    """Why ``spec`` cannot name a corpus file (a path, or ``sha256:`` and 64 hex digits); None
    when it can. Whether the file exists is the reader's question: on the env server's machine."""
    if not spec.strip():
        return "a corpus name must not be blank"
    if "\0" in spec:
        return "a corpus path holds no NUL character"
    if spec.startswith(_DIGEST):
        digest = spec.removeprefix(_DIGEST)
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            return f"{clipped(repr(spec), 80)} is not {_DIGEST} and 64 lower-case hex digits"
    return None


def _check(documents: Iterable[tuple[str, Any]], keep: Callable[[dict[str, str]], None], name: str) -> int:
    """Validates ``(where, raw)`` pairs, hands each good document to ``keep``; raises one
    CorpusError listing every problem (ids must be unique). Returns the count."""
    problems: list[str] = []
    first: dict[str, str] = {}
    count = 0
    for where, raw in documents:
        doc, found = _document(raw, where)
        if doc is not None and doc["id"] in first:
            shown = clipped(repr(doc["id"]), 80)
            found = [f"{where}: field id: duplicate id {shown} (first at {first[doc['id']]})"]
        if found:
            problems += found
            continue
        assert doc is not None
        first[doc["id"]] = where
        count += 1
        if not problems:  # once one is bad, the rest are only checked
            keep(doc)
    if problems:
        more = f"; and {len(problems) - _MAX_ERRORS} more" if len(problems) > _MAX_ERRORS else ""
        raise CorpusError(
            f"{name}: {len(problems)} problem(s): " + "; ".join(problems[:_MAX_ERRORS]) + more,
            fix='each line needs a unique "id" (a string or an integer) and a non-empty "text" '
            '("title" optional)',
        )
    if not count:
        raise CorpusError(f"{name}: no documents", fix="one JSON object per line")
    return count


def _lines(path: Path, hasher: Any) -> Iterable[tuple[str, Any]]:
    """(``line N``, the parsed line) for every non-blank line, hashing the bytes as they are read."""
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            hasher.update(line)
            if not line.strip():
                continue
            where = f"line {number}"
            try:
                yield where, json.loads(line.decode("utf-8-sig" if number == 1 else "utf-8"))
            except UnicodeDecodeError:
                yield where, _Unreadable("not UTF-8")
            except json.JSONDecodeError as e:
                yield where, _Unreadable(f"not JSON ({e.msg} at column {e.colno})")


def _root() -> Path:
    return cache_dir("corpora")


def _file(path: str | os.PathLike[str]) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        where = "" if p.is_absolute() else f" (relative to {Path.cwd()}, this process's working directory)"
        raise CorpusError(f"corpus file not found: {p}{where}", fix="a JSONL path as this process sees it")
    if not p.is_file():  # a directory, a device or a FIFO (which would block a reader)
        raise CorpusError(f"corpus {p} is not a regular file", fix="a JSONL file")
    return p.resolve()


def corpus_digest(path: str | os.PathLike[str]) -> str:
    """The file's sha256, read from the record of an earlier hash when its size, mtime and inode
    are unchanged; hashed (once) otherwise."""
    p = _file(path)
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns, st.st_ino)
    if key in _DIGESTS:
        return _DIGESTS[key]
    record = cache_dir("corpora", "paths") / f"{hashlib.sha256(str(p).encode()).hexdigest()[:32]}.json"
    try:
        seen = json.loads(record.read_text())
        digest = seen["digest"] if tuple(seen["key"]) == key else None
    except (OSError, ValueError, KeyError, TypeError):
        digest = None
    if digest is None:
        hasher = hashlib.sha256()
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                hasher.update(chunk)
        digest = hasher.hexdigest()
        stats["hashed"] += 1
        _write(record, json.dumps({"key": key, "digest": digest}))
    _DIGESTS[key] = digest
    return digest


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(text)
    os.replace(tmp, path)


def build_index(path: str | os.PathLike[str]) -> str:
    """The corpus's digest, its index built under the cache first unless already there."""
    p = _file(path)
    with _os_errors():
        digest = corpus_digest(p)
        final = _root() / digest
        if (final / "meta.json").is_file():
            return digest
        with _LOCK:
            if not (final / "meta.json").is_file():
                _build(p, digest, final)
    return digest


@contextlib.contextmanager
def _os_errors() -> Iterator[None]:
    """An unreadable file or an unwritable cache raised as a CorpusError, not a traceback."""
    try:
        yield
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        raise CorpusError(f"{where}{e.strerror or e}", fix="a readable corpus, a writable $PQRL_CACHE") from e


def _build(p: Path, digest: str, final: Path) -> None:
    started = time.monotonic()
    tmp = _root() / f".build-{digest[:16]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        texts: list[str] = []
        offsets = [0]
        hasher = hashlib.sha256()
        with (tmp / "docs.jsonl").open("wb") as out:

            def keep(doc: dict[str, str]) -> None:
                line = json.dumps(doc, ensure_ascii=False).encode() + b"\n"
                out.write(line)
                offsets.append(offsets[-1] + len(line))
                texts.append(f"{doc['title']} {doc['text']}")

            count = _check(_lines(p, hasher), keep, str(p))
        if hasher.hexdigest() != digest:
            raise CorpusError(f"{p} changed while it was being indexed", fix="index it again")
        np.save(tmp / "offsets.npy", np.asarray(offsets, dtype=np.int64))
        retriever = _bm25(texts, str(p))
        texts.clear()  # the index holds what it needs
        retriever.save(str(tmp / "bm25"), show_progress=False)
        meta = {"digest": digest, "documents": count, "source": str(p),
                "index_s": round(time.monotonic() - started, 2), "bm25s": bm25s.__version__}  # fmt: skip
        (tmp / "meta.json").write_text(json.dumps(meta))
        if (final / "meta.json").is_file():  # another process finished first: keep theirs
            return
        if final.exists():  # a build that died half-way: only a directory with meta.json is whole
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "meta.json").is_file():  # not another process's finished build
                raise
        stats["built"] += 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bm25(texts: list[str], name: str) -> bm25s.BM25:
    """The BM25 index of ``texts`` (title and text of each document)."""
    tokens = bm25s.tokenize(texts, stopwords="en", show_progress=False)
    if not any(tokens.vocab):  # bm25s cannot index a corpus without a word
        raise CorpusError(f"{name}: no document has a word to search for (all are stopwords or punctuation)")
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=False)
    return retriever


def _tokens(queries: list[str]) -> list[list[str]]:
    return bm25s.tokenize(queries, stopwords="en", show_progress=False, return_ids=False)


def query_words(query: str) -> list[str]:
    """The words of ``query`` a BM25 search would look for (no stopwords)."""
    return [w for w in _tokens([query])[0] if w]


class LocalIndex:
    """A bm25s index and its documents: in memory (inline) or memory-mapped from the cache."""

    def __init__(self, retriever: bm25s.BM25, count: int, doc: Callable[[int], dict[str, str]], name: str):
        self.retriever, self.count, self._doc, self.name = retriever, count, doc, name
        self.inline = name == "inline"

    @classmethod
    def from_documents(cls, documents: list[Any]) -> LocalIndex:
        """An inline corpus (a list of documents), indexed once per process."""
        key = hashlib.sha256(json.dumps(documents, sort_keys=True).encode()).hexdigest()
        if key not in _INLINE:
            docs: list[dict[str, str]] = []
            _check(((f"corpus[{i}]", d) for i, d in enumerate(documents)), docs.append, "inline corpus")
            retriever = _bm25([f"{d['title']} {d['text']}" for d in docs], "inline corpus")
            _INLINE[key] = cls(retriever, len(docs), docs.__getitem__, "inline")
        return _INLINE[key]

    @classmethod
    def open(cls, digest: str) -> LocalIndex:
        """The indexed corpus ``digest`` (hex), memory-mapped; once per process."""
        if digest in _OPEN:  # not behind the lock: another corpus may be building
            return _OPEN[digest]
        with _LOCK, _os_errors():
            if digest not in _OPEN:
                _OPEN[digest] = cls._load(_root() / digest)
            return _OPEN[digest]

    @classmethod
    def _load(cls, where: Path) -> LocalIndex:
        name = f"{_DIGEST}{where.name}"
        if not (where / "meta.json").is_file():
            raise CorpusError(f"corpus {name} is not indexed here", fix="run pqrl search index FILE")
        try:
            meta = json.loads((where / "meta.json").read_text())
            retriever = bm25s.BM25.load(str(where / "bm25"), mmap=True)
            offsets = np.load(where / "offsets.npy", mmap_mode="r")
        except (ValueError, KeyError) as e:
            raise CorpusError(
                f"the index of {name} is damaged: {e}", fix=f"remove {where} and index again"
            ) from e
        with (where / "docs.jsonl").open("rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

        def doc(i: int) -> dict[str, str]:
            return json.loads(data[int(offsets[i]) : int(offsets[i + 1])])

        return cls(retriever, int(meta["documents"]), doc, name)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """The best ``k`` documents per query with a score above 0, best first. Ties: in a file's
        index the document earlier in the file first; inline, bm25s's own order (what the
        generated suite has always shown)."""
        out = []
        for words in _tokens(queries):
            ids = self.retriever.get_tokens_ids([w for w in words if w])
            found = (self._bm25s_order(words, k) if self.inline else self._best(ids, k)) if ids else []
            out.append([Hit(**self._doc(j), score=score) for j, score in found])
        return out

    def _best(self, ids: list[int], k: int) -> list[tuple[int, float]]:
        scores = self.retriever.get_scores_from_ids(ids)
        # only documents holding a query word score above 0: select among those, not the whole
        # corpus (bm25s partitions all of it: 40 times slower on 200,000 documents)
        found = np.flatnonzero(scores > 0)
        if len(found) > k:
            found = found[np.argpartition(scores[found], -k)[-k:]]
        return [(int(j), float(scores[j])) for j in found[np.lexsort((found, -scores[found]))]]

    def _bm25s_order(self, words: list[str], k: int) -> list[tuple[int, float]]:
        found = self.retriever.retrieve([words], k=min(k, self.count), show_progress=False)
        pairs = zip(found.documents[0], found.scores[0], strict=True)
        return [(int(j), float(score)) for j, score in pairs if score > 0]


def open_corpus(spec: Any) -> LocalIndex:
    """The suite's ``corpus``: a list of documents, a JSONL path (indexed on first use) or
    ``sha256:<digest>`` of a corpus already indexed on this machine."""
    if isinstance(spec, list):
        return LocalIndex.from_documents(spec)
    if not isinstance(spec, str):
        raise CorpusError(
            f"corpus must be a list of documents, a JSONL path or {_DIGEST}<hex>, not {type(spec).__name__}"
        )
    problem = corpus_name_problem(spec)
    if problem is not None:
        raise CorpusError(f"corpus: {problem}")
    if spec.startswith(_DIGEST):
        return LocalIndex.open(spec.removeprefix(_DIGEST))
    return LocalIndex.open(build_index(spec))
