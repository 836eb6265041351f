"""``pqrl view`` on the rollout log of real ``pqrl train --role trainer`` jobs (a real Redis, a tiny
model, calc-shaped episodes tokenized by the real tokenizer): the page driven in headless Chromium,
and a trainer killed with SIGKILL mid-run whose log pyarrow and the viewer still open."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
import yaml

from launcher.view_command import make_server
from launcher.view_data import RunLog
from pqrl.model_cache import load_tokenizer
from pqrl.redis_server import RedisServer
from pqrl.store import TrajectoryStore
from tests.rollout_cases import INFRA_ERROR, mixed_groups
from tests.webdriver import Browser

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp: Path, model: Path, redis_url: str, **train) -> Path:
    cfg = {
        "run": "r", "output_dir": str(tmp / "out"), "tensorboard": False,
        "model": {"name": str(model), "dtype": "float32"},
        "services": {"redis_url": redis_url},
        "tasks": {"suites": [{"generate": "calc", "n": 4}]},
        "rollout": {"max_staleness": 0},
        "train": {"groups_per_step": 3, "max_extra_reads": 0, "lr": 1e-3, "read_timeout_s": 60} | train,
    }  # fmt: skip
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _trainer(config: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "launcher.cli", "train", str(config), "--role", "trainer", "--quiet"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


async def _fill(url: str, groups: list[list], version: int = 0) -> None:
    async with TrajectoryStore(url, "r") as store:
        await store.groups.create_consumer_group("trainer")
        if version:  # as a trainer before this one would have left it
            await store.policy.publish("earlier", version=version)
        for g in groups:
            await store.groups.put(g)


def _renamed(groups: list[list], suffix: str) -> list[list]:
    return [[dataclasses.replace(t, id=f"{t.id}{suffix}", group_id=f"{t.group_id}{suffix}") for t in g]
            for g in groups]  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """One step of a real trainer job on the three groups of tests.rollout_cases."""
    tmp = tmp_path_factory.mktemp("view")
    tok = load_tokenizer()
    with RedisServer(data_dir=tmp / "redis") as redis:
        # the trainer steps at the published version 1: version 0 is a step behind
        asyncio.run(_fill(redis.url, mixed_groups(tok, version=1, stale_version=0), version=1))
        proc = _trainer(_config(tmp, tiny_model_dir, redis.url, steps=1))
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    return tmp / "out" / "r"


@pytest.fixture
def served(run_dir):
    server = make_server(str(run_dir))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def browser():
    b = Browser()
    yield b
    b.close()


@pytest.mark.timeout(600)
def test_the_page_finds_a_failed_episode_and_shows_what_was_trained(served, browser, tmp_path):
    b = browser
    b.get(served + "/")
    plots = b.wait("#plots svg")
    assert len(plots) == 6, "reward, pass rate, staleness, mismatch KL, tool errors, drops"
    titles = [b.attr(p, "data-title") for p in plots]
    bars = b.js(
        "return [...document.querySelectorAll(\"svg[data-title='dropped, by reason'] rect.bar title\")]"
        ".map(t => t.textContent)"
    )
    assert sorted(bars) == ["failed_infra: 1", "no_signal: 4", "stale: 1"], titles

    b.click(b.wait("#steps a")[0])
    assert len(b.wait("#episodes tr.ep")) == 12
    b.click(b.all("#episodes th[data-key='reward']")[0])  # from descending to ascending
    assert b.js("return document.querySelector('#episodes tr.ep td:nth-child(6)').textContent") == "0"
    b.js("const s = document.getElementById('f-status'); s.value = 'failed_infra';"
         "s.dispatchEvent(new Event('change'))")  # fmt: skip
    rows = b.all("#episodes tr.ep")
    assert [b.attr(r, "data-id") for r in rows] == ["infra-2"]
    b.click(b.all("#episodes tr.ep a")[0])
    assert INFRA_ERROR in b.text(b.wait("#reward-info")[0])

    b.get(served + "/#/step/1")
    b.wait("#episodes tr.ep")
    b.js("const a = document.getElementById('f-amin'); a.value = '0.5'; a.dispatchEvent(new Event('input'))")
    positive = sorted(b.attr(r, "data-id") for r in b.all("#episodes tr.ep"))
    assert positive == ["infra-0", "sig-0", "sig-3"], "the advantage filter keeps the trained winners"
    b.js("const a = document.getElementById('f-amin'); a.value = ''; a.dispatchEvent(new Event('input'))")

    b.get(served + "/#/step/1")
    b.wait("#episodes tr.ep")
    b.js("const s = document.getElementById('f-status'); s.value = 'tool_error';"
         "s.dispatchEvent(new Event('change'))")  # fmt: skip
    b.wait("#episodes tr.ep[data-id='sig-1']")
    b.js("const r = document.getElementById('f-rmax'); r.value = '0'; r.dispatchEvent(new Event('input'))")
    assert [b.attr(r, "data-id") for r in b.all("#episodes tr.ep")] == ["sig-1"]
    b.click(b.all("#episodes tr.ep a")[0])
    info = json.loads(b.text(b.wait("#reward-info")[0]))
    assert info == {"exact": False, "why": "no number in the answer"}
    call = b.all("#tool-calls .tool-call.status-error")
    assert len(call) == 1 and "ZeroDivisionError: division by zero" in b.text(b.all(".tool-output")[0])
    masked = b.js("return [...document.querySelectorAll('.tok.masked')].map(e => e.textContent).join('')")
    assert "I cannot divide by zero" in masked, "the turn left out of the loss is marked"
    trained = b.all(".tok.trained")
    assert trained and "calculator" in b.js(
        "return [...document.querySelectorAll('.tok.trained')].map(e => e.textContent).join('')"
    )
    tip = b.attr(trained[3], "title")
    assert "trainer logprob -" in tip and "behaviour logprob -" in tip and "version 1" in tip, tip
    b.hover(trained[3])
    assert "trainer logprob -" in b.text(b.all("#hover")[0]), "hovering a token shows its numbers"
    png = b.screenshot()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("PQRL_VIEW_SCREENSHOT"):  # refreshes the README's picture
        Path(os.environ["PQRL_VIEW_SCREENSHOT"]).write_bytes(png)

    b.get(served + "/#/group/1/sig")
    members = b.wait(".side .member")
    assert [b.attr(m, "data-id") for m in members] == ["sig-0", "sig-1", "sig-2", "sig-3"]


def test_the_server_refuses_other_hosts_and_unknown_steps(served):
    assert httpx.get(served + "/api/run", headers={"Host": "evil.example:80"}).status_code == 421
    assert httpx.get(served + "/api/step?step=99").status_code == 404
    assert httpx.get(served + "/api/step?step=x").status_code == 400
    flat = httpx.get(served + "/api/episode?step=1&id=flat-0")
    assert "NaN" not in flat.text and flat.json()["reward_info"] == {"exact": False, "similarity": None}
    page = httpx.get(served + "/")
    assert "script-src 'sha256-" in page.headers["content-security-policy"]
    assert "http" not in page.text.split("<script>")[1].replace("http://www.w3.org/2000/svg", ""), (
        "no outside assets"
    )


@pytest.mark.timeout(600)
def test_a_trainer_killed_mid_run_leaves_a_log_pyarrow_and_the_viewer_open(tiny_model_dir, tmp_path):
    tok = load_tokenizer()
    steps = 40
    with RedisServer(data_dir=tmp_path / "redis") as redis:
        groups = [g for s in range(steps) for g in _renamed(mixed_groups(tok, 1, 1)[:1], f"-{s}")]
        asyncio.run(_fill(redis.url, groups))
        config = _config(tmp_path, tiny_model_dir, redis.url, steps=steps, groups_per_step=1)
        cfg = yaml.safe_load(config.read_text())
        cfg["rollout"]["max_staleness"] = 1000
        config.write_text(yaml.safe_dump(cfg))
        proc = _trainer(config)
        logdir = tmp_path / "out" / "r" / "rollouts"
        deadline = time.monotonic() + 240
        live: list[int] = []  # the steps the page listed while the trainer ran
        while len(list(logdir.glob("step-*.parquet"))) < 3 and proc.poll() is None:
            assert time.monotonic() < deadline, "no rollout log after 240 s"
            if not live and list(logdir.glob("step-*.parquet")):
                server = make_server(str(tmp_path / "out" / "r"))
                threading.Thread(target=server.serve_forever, daemon=True).start()
                try:
                    run = httpx.get(f"http://127.0.0.1:{server.server_address[1]}/api/run", timeout=30).json()
                finally:
                    server.shutdown()
                    server.server_close()
                live = [s["step"] for s in run["steps"]]
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "killed mid-run, not finished"
    assert live and live[0] == 1, "the page showed the log while the trainer ran"
    files = sorted(logdir.glob("step-*.parquet"))
    assert 3 <= len(files) < steps
    for f in files:
        table = pq.read_table(f)  # every file left behind is whole
        assert table.num_rows == 4 and set(table.column("group_id").to_pylist()) == {
            f"sig-{int(f.stem[5:]) - 1}"
        }
    log = RunLog(tmp_path / "out" / "r")
    run = log.run()
    assert [s["step"] for s in run["steps"]] == [int(f.stem[5:]) for f in files]
    assert all(s["trained"] == 4 for s in run["steps"])
    episode = log.episode(1, "sig-1-0")
    assert episode["reward_info"]["why"] == "no number in the answer" and episode["texts"]


def test_the_command_serves_on_loopback_and_refuses_a_missing_run(run_dir, tmp_path):
    cmd = [sys.executable, "-m", "launcher.cli", "view"]
    missing = subprocess.run([*cmd, str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such run directory" in missing.stderr
    proc = subprocess.Popen([*cmd, str(run_dir), "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("pqrl view: http://127.0.0.1:"), line
        url = line.split()[2]
        assert [s["step"] for s in httpx.get(url + "api/run").json()["steps"]] == [1]
        taken = url.rstrip("/").rsplit(":", 1)[1]
        again = subprocess.run(
            [*cmd, str(run_dir), "--port", taken], capture_output=True, text=True, timeout=60
        )
        assert again.returncode == 2 and f"port {taken} on 127.0.0.1 is in use" in again.stderr
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_damaged_step_file_and_a_resumed_metrics_file_leave_the_rest_readable(run_dir, tmp_path):
    import shutil

    from trainer.rollout_log import step_file

    copy = tmp_path / "r"
    shutil.copytree(run_dir, copy)
    step_file(copy / "rollouts", 7).write_bytes(b"")  # a file cut short (a power loss before its rename)
    metrics = copy / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    again = {**rows[-1], "rollout/reward_mean": 0.123}  # the step redone after a resume: the later line wins
    metrics.write_text("".join(json.dumps(r) + "\n" for r in [*rows, again]) + '{"step": 9, "rew')
    server = make_server(str(copy))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        run = httpx.get(url + "/api/run").json()
        assert [s["step"] for s in run["steps"]] == [1], run["steps"]
        assert run["unreadable"][0]["step"] == 7, run["unreadable"]
        assert httpx.get(url + "/api/step?step=7").status_code == 500, "a damaged file is not a bad request"
        reward = run["metrics"]["rollout/reward_mean"]
        assert [p[0] for p in reward] == sorted({p[0] for p in reward}), "each step once"
        assert reward[-1][1] == 0.123
    finally:
        server.shutdown()
        server.server_close()


def test_a_wildcard_bind_still_refuses_other_host_names(run_dir):
    server = make_server(str(run_dir), host="0.0.0.0")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api/run"
    try:
        assert httpx.get(url, headers={"Host": "rebound.example"}).status_code == 421
        assert httpx.get(url).status_code == 200, "an address is answered"
        assert httpx.get(url, headers={"Host": "localhost"}).status_code == 200
    finally:
        server.shutdown()
        server.server_close()
