"""search-v1's settings are checked once, by its config model: ``pqrl tasks validate`` refuses
every value a reset would fail on, each as ``line N: suite.defaults.FIELD: why``, and the
environment reads the validated model (``settings``), not the raw arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from env_server.registry import spec
from launcher.cli import main
from tasks.corpus import CorpusError, open_corpus
from tasks.retrieval import RemoteRetriever, retriever_for
from tasks.search import SearchConfig, SearchEnv

ROOT = Path(__file__).resolve().parents[2]
TASK = {"id": "q-1", "kind": "qa", "question": "Which river flows through Velmora?", "answers": ["Kalo"]}
DOC = {"id": "d1", "title": "Velmora", "text": "Velmora lies on the river Kalo."}

# (defaults, the field a problem names, words its reason holds)
BAD = [
    ({"retriever_url": "nope"}, "retriever_url", "not an http(s) URL"),
    ({"retriever_url": "ftp://host/x"}, "retriever_url", "not an http(s) URL"),
    ({"retriever_url": "http://"}, "retriever_url", "not an http(s) URL"),
    ({"retriever_url": "http://127.0.0.1:99999"}, "retriever_url", "not an http(s) URL"),
    ({"retriever_url": "http://a host:8000"}, "retriever_url", "not an http(s) URL"),
    ({"retriever_url": "http://127.0.0.1:8000\n"}, "retriever_url", "not an http(s) URL"),
    ({"corpus": "sha256:zz"}, "corpus", "64 lower-case hex digits"),
    ({"corpus": "sha256:" + "A" * 64}, "corpus", "64 lower-case hex digits"),
    ({"corpus": "   "}, "corpus", "must not be blank"),
    ({"corpus": "a\u0000b.jsonl"}, "corpus", "NUL"),
    ({"corpus": 7}, "corpus", "not int"),
    ({"corpus": [DOC, {"id": "d2", "text": "   "}]}, "corpus.1.text", "not a non-empty string"),
    ({"corpus": [DOC, {"id": "  ", "text": "x"}]}, "corpus.1.id", "not a non-empty string"),
    ({"corpus": [DOC, {"id": 1.5, "text": "x"}]}, "corpus.1.id", "string or an integer, not 1.5"),
    ({"corpus": [DOC, {"id": True, "text": "x"}]}, "corpus.1.id", "string or an integer, not true"),
    ({"corpus": [{"id": 1, "text": "x y"}, {"id": "1", "text": "z"}]}, "corpus.1.id", "duplicate id '1'"),
    ({"corpus": [DOC, {"id": "d2", "title": 3, "text": "x"}]}, "corpus.1.title", "valid string"),
    ({"corpus": [DOC, {"title": "t", "text": "words"}]}, "corpus.1.id", "Field required"),
    ({"corpus": [DOC, DOC]}, "corpus.1.id", "duplicate id 'd1' (first at corpus.0)"),
    ({"corpus": [{"id": "a", "text": "the of"}]}, "corpus", "no document has a word"),
    ({"corpus": []}, "", "give a corpus"),
    ({"corpus": [DOC], "retriever_timeout": "10"}, "retriever_timeout", "valid number"),
    ({"corpus": [DOC], "retriever_timeout": 0}, "retriever_timeout", "greater than 0"),
    ({"corpus": [DOC], "retriever_topk": True}, "retriever_topk", "valid integer"),
    ({"corpus": [DOC], "retriever_topk": 11}, "retriever_topk", "less than or equal to 10"),
    ({"corpus": [DOC], "corpus_file": "x.jsonl"}, "corpus_file", "Extra inputs"),
]


def make_env(env_id: str, **kwargs: object) -> Any:
    """The registered class itself, with its registered arguments (no wrappers)."""
    s = spec(env_id)
    return s.load()(**{**s.kwargs, **kwargs})


def _suite(path: Path, defaults: dict) -> Path:
    manifest = {"name": "s", "version": "1", "env_id": "search-v1", "kind": "qa", "reward": "qa_em_f1",
                "defaults": defaults}  # fmt: skip
    path.write_text(json.dumps({"suite": manifest}) + "\n" + json.dumps(TASK) + "\n")
    return path


def test_validate_refuses_each_bad_setting_with_its_line_and_field(tmp_path, capsys):
    for i, (defaults, field, why) in enumerate(BAD):
        assert main(["tasks", "validate", str(_suite(tmp_path / f"bad{i}.jsonl", defaults))]) == 2, defaults
        out, err = capsys.readouterr()
        where = "suite.defaults" + (f".{field}" if field else "")
        lines = [x for x in out.splitlines() if x.startswith(f"line 1: {where}: ")]
        assert any(why in x for x in lines) and "Traceback" not in err, (defaults, out, err)
    # the command itself, as a user runs it: one bad value, one good suite
    cmd = [sys.executable, "-m", "launcher.cli", "tasks", "validate"]
    r = subprocess.run(
        [*cmd, str(tmp_path / "bad0.jsonl")], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and r.stdout.startswith("line 1: suite.defaults.retriever_url: "), (
        r.stdout + r.stderr
    )
    good = _suite(tmp_path / "good.jsonl", {"corpus": [{"id": 1, "title": None, "contents": '"V"\nVelmora'}]})
    r = subprocess.run([*cmd, str(good)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "1 valid qa tasks" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("defaults", [d for d, _, _ in BAD], ids=[f for _, f, _ in BAD])
def test_the_environment_refuses_what_validate_refuses(defaults):
    """The same rules at construction: a session of such a suite is refused before any reset."""
    with pytest.raises(ValueError):
        make_env("search-v1", **defaults)


async def test_the_environment_reads_the_validated_model():
    env = make_env("search-v1", corpus=[{"id": 4, "title": None, "contents": '"Velmora"\nOn the Kalo.'}],
                   shots=1, format_reward=0.25)  # fmt: skip
    assert isinstance(env, SearchEnv) and isinstance(env.settings, SearchConfig)
    assert env.settings.corpus is not None and env.settings.corpus[0].id == "4"
    assert (env.settings.shots, env.settings.format_reward, env.settings.retriever_topk) == (1, 0.25, 10)
    obs = await env.reset(task=TASK)
    assert sum(m.role == "user" for m in obs.messages) == 2  # one worked example, from settings.shots
    hits = await env.retriever.search("Kalo", 3)  # type: ignore[union-attr]
    assert [(h.id, h.title) for h in hits] == [("4", "Velmora")]
    remote, topk = retriever_for(SearchConfig(retriever_url="http://127.0.0.1:9/", retriever_topk=3))
    assert isinstance(remote, RemoteRetriever) and remote.url == "http://127.0.0.1:9/retrieve" and topk == 3
    # a file is looked for where the env server runs, so only reset can find it missing
    env = make_env("search-v1", corpus="/nonexistent/corpus.jsonl")
    with pytest.raises(CorpusError, match="not found"):
        await env.reset(task=TASK)
    with pytest.raises(CorpusError, match="64 lower-case hex digits"):
        open_corpus("sha256:zz")  # the same rule for a caller that skips the model


def test_every_config_model_environment_keeps_its_settings():
    calc, data = make_env("calc-v1"), make_env("data-v1")
    assert (calc.settings.shots, calc.settings.level) == (1, 2)
    assert (data.settings.shots, data.settings.level) == (2, 1)  # data-v1's own defaults
    assert make_env("repo-v1", test_timeout=30).settings.test_timeout == 30.0
    assert make_env("coding-v1", shots=2).settings.shots == 2
    with pytest.raises(ValueError):
        make_env("repo-v1", shots=3)
