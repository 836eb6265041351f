"""Suites in a real Redis: stored once by hash, submitted idempotently into a run's task queue."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pqrl.store import TrajectoryStore
from tasks.calc import calc_suite
from tasks.storage import SuiteStore

PQRL = str(Path(sys.executable).parent / "pqrl")


async def test_submit_is_idempotent_and_tasks_carry_how_to_run_them(redis_server):
    suite = calc_suite(6, seed=2)
    store = SuiteStore(redis_server.url)
    try:
        assert await store.submit(suite, "run-a") == 6
        assert await store.submit(suite, "run-a") is None, "resubmitting the same suite queues nothing"
        assert await store.submit(suite, "run-b") == 6, "another run gets its own copy"
        assert await store.save(suite) is False, "the suite itself is stored once"
        assert [m["id"] for m in await store.list()] == [suite.id]
        assert await store.get(suite.digest[:6]) == suite
        assert await store.get("calc") == suite
    finally:
        await store.aclose()
    runs = TrajectoryStore(redis_server.url, "run-a")
    try:
        taken = await runs.tasks.take("rollout", "w1", count=100)
        assert len(taken) == 6
        first = taken[0].task
        assert (
            first["suite"] == suite.id
            and first["env_id"] == "calc-v1"
            and first["env_kwargs"] == {"shots": 1}
        )
        assert first["task"] == suite.tasks[0].model_dump() and first["task_id"] == suite.tasks[0].id
    finally:
        await runs.close()


def test_cli_generate_validate_submit_list_show(tmp_path, redis_server):
    path = tmp_path / "calc.jsonl"
    run = lambda *a: subprocess.run([PQRL, "tasks", *a], capture_output=True, text=True, timeout=120)  # noqa: E731
    out = run("generate", "calc", "--n", "10", "--seed", "7", "-o", str(path))
    assert out.returncode == 0, out.stderr
    out = run("validate", str(path))
    assert out.returncode == 0 and "10 valid calc tasks for calc-v1" in out.stdout
    url = ["--redis-url", redis_server.url]
    first = run("submit", str(path), "--run", "r1", *url)
    again = run("submit", str(path), "--run", "r1", *url)
    assert "queued 10 tasks" in first.stdout and "already submitted" in again.stdout
    assert "10 tasks" in run("list", *url).stdout
    shown = run("show", "calc/calc-7-3", *url)
    assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == "calc-7-3"
    missing = run("show", "nope", *url)
    assert missing.returncode == 2 and "no stored suite matches 'nope'" in missing.stderr  # UsageError


def test_cli_generates_every_builtin_generated_suite(tmp_path):
    """Every kind a job config can name: the same suite as the library's generator, flags checked per kind."""
    from tasks.data import data_suite
    from tasks.generators import GENERATED
    from tasks.search import search_suite

    run = lambda *a: subprocess.run([PQRL, "tasks", *a], capture_output=True, text=True, timeout=120)  # noqa: E731
    path = tmp_path / "search.jsonl"
    out = run("generate", "search", "--n", "12", "--seed", "3", "-o", str(path))
    assert out.returncode == 0, out.stderr
    assert path.read_text() == search_suite(12, 3).to_jsonl()
    assert "12 valid qa tasks for search-v1" in run("validate", str(path)).stdout
    wrong = run("generate", "search", "--level", "1", "-o", str(tmp_path / "x.jsonl"))
    assert wrong.returncode == 2 and "level applies to calc and data only" in wrong.stderr  # UsageError
    for kind, env_id in GENERATED.items():
        out = run("generate", kind, "--n", "5", "-o", str(tmp_path / f"{kind}.jsonl"))
        assert out.returncode == 0, out.stderr
        assert (
            f"valid {kind if kind != 'search' else 'qa'} tasks for {env_id}"
            in run("validate", str(tmp_path / f"{kind}.jsonl")).stdout
        )
    assert (tmp_path / "data.jsonl").read_text() == data_suite(5, 0, name="data").to_jsonl()
    assert "(66 tasks)" in run("generate", "coding", "-o", str(tmp_path / "c.jsonl")).stdout


def test_cli_validate_lists_every_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    lines = [json.dumps({"suite": {"name": "x", "version": "1", "env_id": "calc-v1", "kind": "calc",
                                   "reward": "exact_match"}}),
             json.dumps({"id": "a", "kind": "calc", "question": "", "answer": "1"}),
             "garbage"]  # fmt: skip
    bad.write_text("\n".join(lines))
    out = subprocess.run([PQRL, "tasks", "validate", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2  # UsageError: every problem is the result (stdout), then one error line
    assert "line 2 (task a): question" in out.stdout and "line 3: (json)" in out.stdout
    assert out.stderr.splitlines() == [f"pqrl tasks validate: {bad}: 2 problem(s), listed above"]
