"""A corpus as a file: every bad line named with its field, an index built once by content hash and
reused by a later process without re-reading the file, and the search environment reading it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from env_server.types import ToolCall, ToolStatus
from tasks.corpus import CorpusError, LocalIndex, build_index, open_corpus, stats
from tasks.search import search_suite

ROOT = Path(__file__).resolve().parents[2]
SUITE = search_suite(30, seed=5)
DOCS = SUITE.manifest.defaults["corpus"]


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PQRL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_bad_lines_are_named_with_their_line_and_field(tmp_path):
    bad = write(tmp_path / "bad.jsonl", [
        {"id": "a", "title": "A", "text": "fine"},
        {"id": "b", "title": "B"},                      # 2: no text
        {"id": "a", "title": "again", "text": "dup"},   # 3: duplicate id
        "{not json",                                    # 4
        {"title": "no id", "text": "x"},                # 5
        {"id": "c", "title": 7, "text": "x"},           # 6: title not a string
        ["a", "list"],                                  # 7
        {"id": "d", "text": "   "},                     # 8: blank text
        {"id": 1.5, "text": "x"},                       # 9: an id neither a string nor an integer
        {"id": True, "text": "x"},                      # 10
    ])  # fmt: skip
    with bad.open("ab") as f:
        f.write(b'{"id": "e", "text": "\xff"}\n')  # 11: not UTF-8
    with pytest.raises(CorpusError) as e:
        build_index(bad)
    message = str(e.value)
    not_id = "field id: an id is a non-empty string or an integer, not"
    for expected in ("line 2: field text: missing", "line 3: field id: duplicate id 'a' (first at line 1)",
                     "line 4: not JSON", "line 5: field id: missing", "line 6: field title: not a string",
                     "line 7: not a JSON object", "line 8: field text: not a non-empty string",
                     "line 11: not UTF-8", f"line 9: {not_id} 1.5",
                     f"line 10: {not_id} true"):  # fmt: skip
        assert expected in message, message
    assert "line 1:" not in message  # the good line
    assert e.value.exit_code == 2 and isinstance(e.value, ValueError)
    with pytest.raises(CorpusError, match="no documents"):
        build_index(write(tmp_path / "empty.jsonl", ["", "  "]))
    with pytest.raises(CorpusError, match="no document has a word to search for"):
        build_index(write(tmp_path / "stop.jsonl", [{"id": "a", "text": "the"}, {"id": "b", "text": "!!"}]))
    with pytest.raises(CorpusError, match="no document has a word to search for"):
        LocalIndex.from_documents([{"id": "a", "text": "of the"}])
    untitled = write(
        tmp_path / "untitled.jsonl", [{"id": 7, "title": None, "text": "Velmora lies on the Kalo"}]
    )
    assert open_corpus(str(untitled)).search(["Kalo"], 1)[0][0].id == "7"
    with pytest.raises(CorpusError, match="not found"):
        build_index(tmp_path / "missing.jsonl")
    for odd in (tmp_path, "/dev/null"):  # a directory; a device (a FIFO would block its reader)
        with pytest.raises(CorpusError, match="not a regular file"):
            build_index(odd)
    bom = tmp_path / "bom.jsonl"  # as some editors save UTF-8
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "a", "text": "Velmora"}).encode() + b"\r\n")
    assert open_corpus(str(bom)).search(["velmora"], 3)[0][0].id == "a"
    with pytest.raises(CorpusError, match=r"corpus\[1\]: field text: missing"):
        LocalIndex.from_documents([{"id": "x", "text": "t"}, {"id": "y"}])
    with pytest.raises(CorpusError, match="is not indexed here"):
        open_corpus("sha256:" + "0" * 64)


def _pqrl(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PQRL_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "launcher.cli", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_an_index_is_built_once_and_a_later_process_reuses_it_without_rehashing(tmp_path, cache):
    corpus = write(tmp_path / "corpus.jsonl", DOCS)
    first = _pqrl("search", "index", "--corpus", str(corpus), cache=cache)
    assert first.returncode == 0, first.stderr
    name = first.stdout.strip()
    built = cache / "corpora" / name.removeprefix("sha256:")
    assert json.loads((built / "meta.json").read_text())["documents"] == len(DOCS)
    (record,) = (cache / "corpora" / "paths").iterdir()
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in [record, *built.rglob("*")]}
    second = _pqrl("search", "index", "--corpus", str(corpus), cache=cache)
    assert second.returncode == 0 and second.stdout.strip() == name, second.stderr
    # nothing rewritten: neither the index nor the hash record (a re-hash replaces it)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in before} == before
    assert sorted(p.name for p in (cache / "corpora").iterdir()) == sorted([built.name, "paths"])
    # the digest names the indexed corpus; a changed file is a new corpus
    assert open_corpus(name).count == len(DOCS)
    write(corpus, DOCS[:-1])
    changed = _pqrl("search", "index", "--corpus", str(corpus), cache=cache)
    assert changed.returncode == 0 and changed.stdout.strip() != name
    bad = _pqrl("search", "index", "--corpus", str(write(tmp_path / "b.jsonl", [{"id": 1}])), cache=cache)
    assert bad.returncode == 2 and "line 1: field text: missing" in bad.stderr
    assert "Traceback" not in bad.stderr
    (built / "meta.json").write_text("{half")  # a damaged index says what to do, without a traceback
    damaged = _pqrl("search", "index", "--corpus", str(write(corpus, DOCS)), cache=cache)
    assert damaged.returncode == 2 and f"remove {built}" in damaged.stderr, damaged.stderr
    (tmp_path / "file").write_text("")
    unwritable = _pqrl("search", "index", "--corpus", str(corpus), cache=tmp_path / "file" / "cache")
    assert unwritable.returncode == 2 and "Not a directory" in unwritable.stderr, unwritable.stderr
    assert "Traceback" not in unwritable.stderr


def _ranked(hits) -> list[tuple[float, frozenset[str]]]:
    """The scores best first, each with the documents that share it (ties may come in any order)."""
    scores = sorted({round(h.score, 5) for h in hits}, reverse=True)
    return [(s, frozenset(h.id for h in hits if round(h.score, 5) == s)) for s in scores]


async def test_a_corpus_file_ranks_as_the_same_corpus_inline_does(tmp_path, client):
    """The generated corpus written as a file: the same scores and documents as inline (a tie is
    broken by file order there), and the search environment reads it by path or by digest."""
    corpus = write(tmp_path / "corpus.jsonl", DOCS)
    inline, filed = LocalIndex.from_documents(DOCS), open_corpus(str(corpus))
    queries = [t.question for t in SUITE.tasks] + ["river", "composer born 1845", "zzqx", "the of"]
    for query, a, b in zip(queries, inline.search(queries, 30), filed.search(queries, 30), strict=True):
        assert _ranked(a) == _ranked(b), query
        assert [h.score for h in b] == sorted((h.score for h in b), reverse=True)
        ties = [(h.score, DOCS.index(next(d for d in DOCS if d["id"] == h.id))) for h in b]
        assert ties == sorted(ties, key=lambda t: (-t[0], t[1])), "ties in file order"
    named = {"corpus": str(corpus)}
    digest = {"corpus": "sha256:" + build_index(corpus)}
    done = dict(stats)
    for task in SUITE.tasks[:10]:
        outs = []
        for kwargs in (named, digest):
            s = await client.create_session("search-v1", task.model_dump(), env_kwargs=kwargs)
            call = ToolCall(name="search", arguments={"query": task.question, "k": 3})
            outs.append((await client.step(s.session_id, [call])).messages[0].content)
        assert outs[0] == outs[1] and outs[0].startswith("[1] ")
    assert stats == done, "no reset hashed or indexed the file again"
    # a corpus the environment cannot read rejects the task when the session starts
    with pytest.raises(Exception, match="corpus file not found"):
        await client.create_session("search-v1", SUITE.tasks[0].model_dump(), env_kwargs={"corpus": "/nope"})
    capped = await client.create_session(
        "search-v1", SUITE.tasks[0].model_dump(), env_kwargs={**named, "retriever_topk": 1}
    )
    out = await client.step(
        capped.session_id, [ToolCall(name="search", arguments={"query": "river", "k": 5})]
    )
    assert out.messages[0].status is ToolStatus.OK and out.messages[0].content.count("\n[") == 0


def test_a_suite_keeps_its_corpus_path_as_written_and_a_missing_one_says_relative_to_what(
    tmp_path, monkeypatch
):
    """The suite's text (and digest) is what its file says, wherever the file lies: env servers on
    other hosts read the path as they see it. A path not found says what it was relative to."""
    from tasks.suite import Suite, load_suite

    manifest = SUITE.manifest.model_copy(update={"defaults": {"corpus": "corpus.jsonl"}})
    for folder in (tmp_path / "a", tmp_path / "b"):
        folder.mkdir()
        (folder / "wiki.jsonl").write_text(Suite(manifest, SUITE.tasks).to_jsonl())
    a, b = load_suite(tmp_path / "a" / "wiki.jsonl"), load_suite(tmp_path / "b" / "wiki.jsonl")
    assert a.manifest.defaults["corpus"] == "corpus.jsonl" and a.id == b.id
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        CorpusError, match=rf"not found: nowhere.jsonl \(relative to {tmp_path}, this process"
    ):
        build_index("nowhere.jsonl")
