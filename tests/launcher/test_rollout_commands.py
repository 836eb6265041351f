"""The command line end to end: `pqrl engine serve`, `pqrl tasks submit`, `pqrl rollout` and
`pqrl trajectories show` as separate processes over real HTTP and a real Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pqrl.errors import JobEnded, RetriesExhausted
from pqrl.redis_server import free_port
from tests.servers import wait_until_healthy

PQRL = str(Path(sys.executable).parent / "pqrl")


def test_engine_rollout_and_show(tmp_path, redis_server):
    port = free_port()
    engine = subprocess.Popen(
        [PQRL, "engine", "serve", "--port", str(port)], stderr=subprocess.PIPE, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_healthy(url, engine, lambda: engine.stderr.read() if engine.poll() is not None else "")
        suite = tmp_path / "calc.jsonl"
        run = lambda *a: subprocess.run([PQRL, *a], capture_output=True, text=True, timeout=300)  # noqa: E731
        assert run("tasks", "generate", "calc", "--n", "2", "--seed", "9", "-o", str(suite)).returncode == 0
        assert (
            run("tasks", "submit", str(suite), "--run", "cli", "--redis-url", redis_server.url).returncode
            == 0
        )
        args = ["--run", "cli", "--redis-url", redis_server.url, "--engine", url, "--group-size", "2"]
        out = run(
            "rollout",
            *args,
            "--groups-per-step",
            "4",
            "--max-turns",
            "2",
            "--max-new-tokens",
            "12",
            "--max-total-tokens",
            "768",
            "--quiet",
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert "groups written 2, dropped 0" in out.stdout
        assert out.stderr == "", "--quiet: no progress, no logging, no library warnings"
        shown = run("trajectories", "show", "--run", "cli", "--redis-url", redis_server.url, "--groups", "2")
        assert shown.returncode == 0, shown.stderr[-2000:]
        assert shown.stdout.count("== group ") == 2 and shown.stdout.count("-- ") == 4
        assert "[prompt]" in shown.stdout and "[gen v0]" in shown.stdout
        assert "[calc-v1] 4 trajectories: response length" in shown.stdout
    finally:
        engine.terminate()
        engine.wait(30)


def test_tasks_filter_keeping_no_task_ends_the_job_writes_nothing_and_quiet_prints_only_that(tmp_path):
    suite, out = tmp_path / "calc.jsonl", tmp_path / "filtered.jsonl"
    gen = subprocess.run([PQRL, "tasks", "generate", "calc", "--n", "2", "--seed", "3", "-o", str(suite)])
    assert gen.returncode == 0
    args = ["--samples", "2", "--max-turns", "2", "--max-new-tokens", "12", "--max-total-tokens", "768"]
    # the untrained policy solves neither task: nothing to keep
    run = subprocess.run([PQRL, "tasks", "filter", str(suite), "-o", str(out), *args, "--quiet"],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == JobEnded.exit_code, run.stderr[-2000:]
    assert not out.exists()
    assert run.stderr.splitlines() == [
        "pqrl tasks filter: no task has a pass rate in (0, 1) (mean pass rate 0.000); nothing written "
        "(filter a suite this policy sometimes solves, or sample more (--samples))"
    ], "--quiet leaves the error line alone on stderr: no progress, no library warnings"
    rows = [line.split() for line in run.stdout.splitlines()]
    ids = [json.loads(line)["id"] for line in suite.read_text().splitlines()[1:]]
    assert [r for r in rows if r and r[0] in ids] == [[i, "0.00", "no"] for i in ids]  # a row per task
    assert "kept (0 < c < 1)" in run.stdout and "0 of 2" in run.stdout


def test_tasks_filter_rates_no_task_that_never_ran(tmp_path):
    """The data suite's sandboxes need Docker, here unreachable: no task is rated 0 ("never solved")
    for episodes that never ran; the command says so in one line and exits 1."""
    suite, out = tmp_path / "data.jsonl", tmp_path / "filtered.jsonl"
    gen = subprocess.run([PQRL, "tasks", "generate", "data", "--n", "2", "-o", str(suite)])
    assert gen.returncode == 0
    args = ["--samples", "2", "--max-turns", "1", "--max-new-tokens", "8"]
    env = os.environ | {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    run = subprocess.run([PQRL, "tasks", "filter", str(suite), "-o", str(out), *args], capture_output=True,
                         text=True, timeout=600, env=env)  # fmt: skip
    assert run.returncode == JobEnded.exit_code, run.stdout + run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("pqrl tasks filter: no pass rate: no task ran, all 2 failed on infrastructure")
    assert not out.exists() and "kept" not in run.stdout


def test_rollout_with_redis_down_gives_up_after_its_grace_with_one_line():
    """Nothing listens on the port: admission retries for ``--redis-grace-s``, then the command
    ends as RetriesExhausted (exit 4) with one line naming the URL and what to do."""
    url = f"redis://127.0.0.1:{free_port()}"
    args = ["rollout", "--run", "down", "--redis-url", url, "--engine", f"http://127.0.0.1:{free_port()}",
            "--groups-per-step", "1", "--redis-grace-s", "2", "--backend", "builtin"]  # fmt: skip
    out = subprocess.run([PQRL, *args, "--quiet"], capture_output=True, text=True, timeout=120)
    assert out.returncode == RetriesExhausted.exit_code == 4, out.stdout + out.stderr
    assert out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"pqrl rollout: Redis unreachable for 2s: cannot reach Redis at {url}")
    assert "(start Redis or check --redis-url" in out.stderr
    # without --quiet: the retries are logged, and the command ends the same way
    loud = subprocess.run([PQRL, *args], capture_output=True, text=True, timeout=120)
    assert loud.returncode == 4 and loud.stderr.splitlines()[-1] == out.stderr.strip(), loud.stderr
    assert "Redis unreachable (retried" in loud.stderr
