"""train.report_to: wandb, offline. A real trainer loop (Redis, a tiny model, GRPO steps) writes its
metrics and rollout log; the tracker mirrors them, and the offline run's own ``.wandb`` record file,
decoded with wandb's protobuf schema, holds each step's numbers, the manifest as the run's config,
and a table of sampled episodes that are the rollout log's."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pqrl.errors import UsageError
from pqrl.model_cache import load_tokenizer
from tests.trainer.one_thread import one_torch_thread  # noqa: F401 (autouse: torch on one thread)
from tests.trainer.test_rollout_log import _run
from trainer.rollout_log import step_file
from trainer.trackers import Trackers, require

BLOCK = 32768  # the .wandb file is a LevelDB log after a 7-byte W&B header


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def wandb_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        buf, pos = buf + data[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # FULL or LAST: a whole record
            out.append(pb.Record.FromString(buf))
            buf = b""
    return out


def wandb_history(path: Path) -> dict[int, dict]:
    """Step -> the values logged at it, from the run's record file."""
    history: dict[int, dict] = {}
    for r in wandb_records(path):
        if r.WhichOneof("record_type") == "history":
            for i in r.history.item:  # a table is nested: ("rollout/episodes", "path"), ...
                row = history.setdefault(r.history.step.num, {})
                *outer, last = list(i.nested_key) or [i.key]
                for k in outer:
                    row = row.setdefault(k, {})
                row[last] = json.loads(i.value_json)
    return history


async def test_offline_wandb_holds_every_steps_metrics_the_manifest_and_episodes(
    redis_server, tmp_path, tok, monkeypatch
):
    monkeypatch.setattr(sys, "argv", [*sys.argv, "--redis-url", "redis://:SECRETPW@localhost"])
    metrics = await _run(redis_server.url, tmp_path, tok, stream=False, steps=2)
    manifest = {"run": "tiny", "train": {"lr": 0.001, "report_to": ["wandb"]}}
    run_dir = tmp_path / "run"
    trackers = Trackers(run_dir, ["wandb"], name="tiny", config=manifest, rollout_dir=tmp_path / "rollouts",
                        episodes_per_step=3)  # fmt: skip
    for step, m in enumerate(metrics, 1):
        trackers.log(step, m)
    trackers.close()

    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    records = wandb_records(next(offline.glob("*.wandb")))
    history = wandb_history(next(offline.glob("*.wandb")))
    assert sorted(history) == [1, 2]
    for step, m in enumerate(metrics, 1):
        assert m and all(history[step][k] == pytest.approx(v) for k, v in m.items()), step
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["train"] == manifest["train"] and config["run"] == "tiny"

    tables = [v for row in history.values() for k, v in row.items() if k == "rollout/episodes"]
    assert tables and all(t["_type"] == "table-file" for t in tables)
    logged = [row for t in tables for row in json.loads((offline / "files" / t["path"]).read_text())["data"]]
    assert len(logged) == 6  # 3 per step, both steps
    parquet = {(r["step"], r["task_id"], r["reward"]) for s in (1, 2)
               for r in pq.read_table(step_file(tmp_path / "rollouts", s)).to_pylist()}  # fmt: skip
    assert {(r[0], r[1], r[4]) for r in logged} <= parquet and {r[0] for r in logged} == {1, 2}
    assert b"SECRETPW" not in next(offline.glob("*.wandb")).read_bytes()  # the command line is not kept
    children = subprocess.run(
        ["ps", "-o", "args=", "--ppid", str(os.getpid())], capture_output=True, text=True
    )
    assert "wandb-core" not in children.stdout  # the service this run started is gone


def test_a_named_tracker_that_is_not_installed_is_a_one_line_usage_error(monkeypatch):
    require([])
    require(["wandb"])
    monkeypatch.setitem(sys.modules, "wandb", None)  # what ``import wandb`` meets without the package
    with pytest.raises(UsageError) as e:
        require(["wandb"])
    assert e.value.exit_code == 2 and "pqrl[wandb]" in e.value.fix and "\n" not in e.value.line()
    with pytest.raises(UsageError, match="unknown tracker 'mlflow'"):
        require(["mlflow"])


def test_no_tracker_writes_nothing(tmp_path):
    trackers = Trackers(tmp_path, [], name="r", config={})
    trackers.log(1, {"rollout/reward_mean": 1.0})
    trackers.close()
    assert not (tmp_path / "wandb").exists()


def test_pqrl_train_without_the_package_stops_with_one_line_before_anything_runs(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(
        f"run: r1\noutput_dir: {tmp_path}\ntasks: {{suites: [{{generate: calc, level: 1, n: 2}}]}}\n"
        "train: {report_to: [wandb]}\n"
    )
    # what ``import wandb`` meets where the package is not installed
    block = (
        "import runpy, sys; "
        "sys.modules['wandb'] = None; runpy.run_module('launcher.cli', run_name='__main__')"
    )
    out = subprocess.run([sys.executable, "-c", block, "train", str(config)], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "pqrl[wandb]" in out.stderr and not (tmp_path / "r1").exists()
    config.write_text(config.read_text().replace("[wandb]", "[mlflow]"))  # not a tracker pqrl has
    out = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "train", str(config)], capture_output=True, text=True
    )
    assert out.returncode == 2 and "report_to" in out.stderr
