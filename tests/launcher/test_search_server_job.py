"""The search suite trained against a retrieval server, as examples/search_server.yaml runs it:
``pqrl tasks generate search --corpus-out`` writes the questions and their corpus, ``pqrl search
serve`` serves the corpus in a process of its own, and ``pqrl train`` (SmolLM2 in an engine
process, a private Redis) runs a job whose suite's defaults name that server. Every search the
model wrote was answered by the server (its query counter), rewards were produced, and nothing is
left running."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
import yaml

from pqrl.redis_server import free_port, stop_process
from tasks.corpus import query_words
from tests.launcher.test_fail_fast import _processes_mentioning
from tests.servers import stored_groups

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
PQRL = [sys.executable, "-m", "launcher.cli"]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(the URL of ``pqrl search serve`` over the generated corpus, the suite's questions)."""
    suite, corpus = tmp_path / "search.jsonl", tmp_path / "corpus.jsonl"
    args = ["tasks", "generate", "search", "--n", "16", "--seed", "3", "--shots", "2"]
    r = subprocess.run([*PQRL, *args, "-o", str(suite), "--corpus-out", str(corpus)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0 and "wrote its corpus" in r.stdout, r.stdout + r.stderr
    port = free_port()
    cache = {"PQRL_CACHE": str(tmp_path / "cache")}  # the corpus is indexed here, not in the user's cache
    proc = subprocess.Popen([*PQRL, "search", "serve", "--corpus", str(corpus), "--port", str(port)],
                            cwd=ROOT, env=os.environ | cache, stderr=subprocess.PIPE, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _healthy(url):
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read() if proc.stderr else ""
            )
            time.sleep(0.2)
        yield url, suite
    finally:
        stop_process(proc)
    assert proc.returncode is not None


def test_a_search_job_reads_its_articles_from_the_retrieval_server(server, tmp_path):
    url, suite = server
    assert httpx.get(f"{url}/healthz").json()["queries"] == 0
    cfg = yaml.safe_load((ROOT / "examples" / "search_server.yaml").read_text())
    run = f"search-server-{uuid.uuid4().hex[:8]}"
    cfg |= {"run": run, "output_dir": str(tmp_path / "runs")}
    ref = cfg["tasks"]["suites"][0]
    ref |= {"n": 16, "seed": 3}  # the questions of the served corpus
    ref["defaults"]["retriever_url"] = url
    # Whether the base model searches first or guesses is decided mostly by the question (a group
    # at 0.7 tends to search all or none), and which questions do varies with the CPU's numerics. So
    # many questions in small groups, sampled at 1.0: about one episode in three searches.
    cfg["rollout"] |= {"group_size": 2, "max_turns": 2, "max_new_tokens": 48, "seed": 0, "temperature": 1.0}
    cfg["train"] |= {"steps": 2, "groups_per_step": 4, "max_extra_reads": 1, "warmup_steps": 0}
    cfg["checkpoint"] = {"every": 1}
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(cfg))

    r = subprocess.run([*PQRL, "train", str(config), "--quiet"], cwd=ROOT, capture_output=True, text=True,
                       timeout=500)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["exit_code"] == 0 and summary["ended"].startswith("done")
    assert _processes_mentioning(tmp_path / "runs") == [], "the job left processes"

    # every episode: those the steps read (the rollout log) and those still queued in the job's Redis
    log = tmp_path / "runs" / run / "rollouts"
    trained = [e for f in sorted(log.glob("step-*.parquet")) for e in pq.read_table(f).to_pylist()]
    queued = [t for g in asyncio.run(stored_groups(tmp_path / "runs" / run / "redis", run)) for t in g]
    episodes = [(e["env"], e["reward"], json.loads(e["reward_info"])) for e in trained]
    episodes += [(t.env, t.reward, t.reward_info) for t in queued]
    assert len(trained) >= 2 * 4 * 2 and {env for env, _, _ in episodes} == {"search-v1"}
    assert all(0.0 <= reward <= 1.0 and "found" in info for _, reward, info in episodes)  # rewards produced
    calls = [c for e in trained for turn in json.loads(e["turns"]) for c in turn["tool_calls"]]
    calls += [{"name": c.name, "arguments": c.arguments, "status": c.status and c.status.value}
              for t in queued for turn in t.turns for c in turn.tool_calls]  # fmt: skip
    asked = [c for c in calls if c["name"] == "search" and c["status"] == "ok"
             and query_words(str(c["arguments"].get("query", "")))]  # fmt: skip
    assert asked, f"no episode searched: {calls}"
    # every search of these episodes asked the server (groups dropped in flight may have asked more)
    served = httpx.get(f"{url}/healthz").json()
    assert len(asked) <= served["queries"] == served["requests"], served
    assert _processes_mentioning(tmp_path / "runs") == [], "reading the episodes back left its Redis running"
