"""``pqrl train`` end to end in embedded mode with every real part (private Redis, an engine
process updated from disk, the calc environment, the rollout manager, the trainer), then resumed
by running the same command with a larger budget; and ``pqrl status`` on a run's figures."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from launcher.cli import main
from launcher.jobconfig import load_config
from launcher.ram_weights import ram_weights_dir
from launcher.trainer_build import build_trainer
from pqrl.store import TrajectoryStore
from tests.trainer.test_trackers import wandb_history
from trainer.distributed import DistContext


def _job(tmp_path: Path) -> Path:
    cfg = {
        "run": "e2e", "output_dir": str(tmp_path / "runs"),
        # the quickstart's shaping (two worked examples, credit for using the numbers, T 0.7): about
        # one sample in fourteen earns reward, so a group of 4 carries signal about one time in four
        # and 16 reads miss every time with probability ~1%
        "tasks": {"suites": [{"generate": "calc", "level": 1, "n": 16, "shots": 2, "format_reward": 0.2}]},
        "rollout": {"group_size": 4, "max_turns": 2, "max_new_tokens": 48, "max_total_tokens": 1024,
                    "max_concurrent_groups": 2, "temperature": 0.7},
        "train": {"steps": 1, "groups_per_step": 1, "lr": 1e-5, "read_timeout_s": 600, "max_extra_reads": 15,
                  "report_to": ["wandb"]},
        "checkpoint": {"every": 1},
        "eval": {"k": 2, "suite": {"generate": "calc", "level": 1, "n": 2, "seed": 99}},
    }  # fmt: skip
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(config: Path, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "launcher.cli", "train", str(config), "--quiet", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert out.stderr == "", "--quiet: no progress, no logging, no library warnings"
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(900)  # two whole jobs: about 90 s on 2 idle cores, several times that on a busy one
def test_embedded_job_trains_checkpoints_evaluates_and_resumes(tmp_path):
    config = _job(tmp_path)
    first = _train(config)
    run = tmp_path / "runs" / "e2e"
    assert first["steps"] == 1 and 0.0 <= first["eval_before"] <= 1.0 and "eval_after" in first
    # the job's time by phase, in order; ``minutes`` counts from the command's start, so covers them
    phases = first["phase_s"]
    assert list(phases) == ["start-up", "eval before", "steps", "checkpoints in steps", "wind-down",
                            "eval after", "last checkpoint"], phases  # fmt: skip
    assert phases["checkpoints in steps"] == 0.0, "the last step's checkpoint: beside the evaluation"
    spent = sum(v for k, v in phases.items() if k != "checkpoints in steps")
    assert 0 < spent <= first["minutes"] * 60 + 1, (phases, first["minutes"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "rollout/groups" in r]
    # dynamic sampling reads past signal-free groups: 1 group, up to 15 extra reads
    assert [r["step"] for r in train_rows] == [1] and 1 <= train_rows[0]["rollout/groups"] <= 16
    trained = train_rows[0]
    assert trained.get("rollout/trajectories_used", 0) > 0 and "losses/pg_loss" in trained, (
        f"the step trained nothing: {trained}"
    )
    assert [r["step"] for r in rows if "eval/pass@1" in r] == [0, 1]
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    (wandb_run,) = (run / "wandb").glob("offline-run-*")  # train.report_to: the same numbers, offline
    history = wandb_history(next(wandb_run.glob("*.wandb")))
    assert history[1]["rollout/reward_mean"] == pytest.approx(trained["rollout/reward_mean"])
    assert 0 in history and "eval/pass@1" in history[0]
    assert (run / "checkpoints" / "latest").read_text() == "step-000001"
    manifest = json.loads((run / "manifest.json").read_text())
    assert (run / "checkpoints" / "step-000001" / "manifest.json").read_text() == (
        run / "manifest.json"
    ).read_text()
    assert len(manifest["git"]["revision"]) == 40 and isinstance(manifest["git"]["dirty"], bool)
    assert manifest["config"]["rollout"]["temperature"] == 0.7 and manifest["packages"]["torch"]
    assert [s["tasks"] for s in manifest["suites"]] == [16] and len(manifest["base_model"]["digest"]) == 16
    assert not (run / "services.json").exists(), "the private services are gone after the job"
    ram = ram_weights_dir(run, 1, 1)  # where the published weights went, if this machine has tmpfs
    assert ram is None or not ((run / "weights").exists() or ram.exists()), "in RAM, and removed at the end"

    second = _train(config, "--set", "train.steps=2")
    assert second["steps"] == 2
    assert second["policy_version"] > first["policy_version"], "resume serves the checkpoint as a new version"
    state = json.loads((run / "checkpoints" / "step-000002" / "state.json").read_text())
    groups = state["trained_groups"]
    assert state["step"] == 2 and 2 <= len(groups) <= 8 and len(set(groups)) == len(groups)
    assert "eval_before" not in second, "a resumed run does not evaluate the start again"
    assert second["phase_s"]["eval before"] == 0.0 and second["phase_s"]["steps"] > 0


@pytest.mark.timeout(900)
def test_a_sandboxed_suite_gets_a_private_env_server_whose_sandboxes_go_with_it(tmp_path):
    """The data suite needs sandboxes: the job starts its own env server process (token on) with a
    warm pool labelled with the run, the model's commands run there, and nothing is left after."""
    from sandboxes.docker_api import DockerAPI

    config = _job(tmp_path)
    data = {"run": "e2e-data", "tasks.suites": [{"generate": "data", "n": 8}],
            "eval.suite": {"generate": "data", "n": 2, "seed": 99},
            "rollout.max_turns": 3, "rollout.max_new_tokens": 48}  # fmt: skip
    summary = _train(config, *[f"--set={k}={json.dumps(v)}" for k, v in data.items()])
    run = tmp_path / "runs" / "e2e-data"
    assert summary["steps"] == 1 and "eval_after" in summary
    assert (run / "env_server.log").exists() and not (run / "services.json").exists()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "rollout/groups" in r)
    assert step["rollout/tool_calls"] > 0 and step.get("rollout/failed_infra_frac", 0.0) == 0.0

    async def left() -> list:
        api = DockerAPI()
        try:
            return await api.list({"pqrl.run": "e2e-data"})
        finally:
            await api.close()

    assert asyncio.run(left()) == [], "the env server removed its sandboxes when the job stopped"


def test_status_shows_a_runs_figures(redis_server, capsys):
    async def report() -> None:
        async with TrajectoryStore(redis_server.url, "st") as store:
            await store.policy.publish("/w/v3", version=3)
            await store.status.set({"phase": "training", "step": 3, "steps": 10, "reward_trend": [0.1, 0.25],
                                    "failures": {"engine": 2}, "staleness": {"0": 5, "1": 3}})  # fmt: skip

    assert main(["status", "--run", "st", "--redis-url", redis_server.url]) == 1  # nothing reported yet
    capsys.readouterr()
    asyncio.run(report())
    assert main(["status", "--run", "st", "--redis-url", redis_server.url]) == 0
    out = capsys.readouterr().out
    assert "training step 3/10, policy v3" in out and "[0.1, 0.25]" in out and "'engine': 2" in out
    assert "made of: unknown (no manifest)" in out


def test_status_shows_what_the_run_is_made_of(redis_server, capsys):
    from launcher.manifest import manifest_gist, model_digest

    manifest = {"git": {"revision": "0123456789abcdef", "dirty": True}, "python": "3.11.2",
                "base_model": model_digest("smollm2-135m-instruct"), "packages": {"torch": "2.13.0"},
                "suites": [{"id": "calc@abc", "tasks": 16}], "devices": {"cuda": [], "cpus": 2}}  # fmt: skip

    async def report() -> None:
        async with TrajectoryStore(redis_server.url, "mf") as store:
            await store.status.set({"phase": "training", "manifest": manifest_gist(manifest)})

    asyncio.run(report())
    assert main(["status", "--run", "mf", "--redis-url", redis_server.url]) == 0
    made_of = next(line for line in capsys.readouterr().out.splitlines() if "made of" in line)
    assert "code 0123456789 (uncommitted changes)" in made_of and "calc@abc (16)" in made_of
    assert manifest["base_model"]["digest"] in made_of and "2 CPUs" in made_of


@pytest.mark.timeout(900)
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_after_the_step_checkpoints_and_skips_the_final_evaluation(tmp_path, presses):
    """SIGINT during training: the step in flight finishes, is checkpointed, the job exits 0 without
    the "after" evaluation and says how to get it; evaluations show a progress bar. Twice: the step
    in flight (reading groups or training) is given up instead, and the last one trained is saved (a
    step still waiting for groups gives way at the first)."""
    import os
    import signal
    import time

    config = _job(tmp_path)
    cmd = [sys.executable, "-m", "launcher.cli", "train", str(config), "--set", "train.steps=50"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "runs" / "e2e" / "metrics.jsonl"
    latest = tmp_path / "runs" / "e2e" / "checkpoints" / "latest"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        # step 1 trained and checkpointed: the signals come while step 2 reads groups or trains
        if latest.exists() and latest.read_text() == "step-000001":
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    for _ in range(presses):
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(0.5)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert 1 <= summary["steps"] < 50 and "eval_before" in summary and "eval_after" not in summary
    assert "final evaluation skipped" in err and "eval@0" in err
    assert latest.read_text() == f"step-{summary['steps']:06d}", "the last step trained is checkpointed"
    if presses == 2:  # step 2 was reading or training when the signals came: given up, not finished
        assert summary["steps"] == 1
        # the first press ends a step waiting for groups; the second gives up one training (or the
        # loop, when the presses fall between two steps)
        waited = "stopped while step 2 waited for groups" in err
        assert waited or "stopping at once" in err, err[-3000:]
        trained = [json.loads(x)["step"] for x in metrics.read_text().splitlines() if "rollout/groups" in x]
        assert trained == [1]


@pytest.mark.timeout(900)
def test_a_ppo_job_checkpoints_its_critic_and_resumes_with_it(tmp_path):
    """``algorithm.advantage: ppo``: the job builds the value head, trains it with the policy (the
    step's metrics carry the value loss), saves it in every checkpoint and loads it on resume."""
    config = _job(tmp_path)
    cfg = yaml.safe_load(config.read_text())
    cfg["algorithm"] = {"advantage": "ppo", "lam": 0.9}
    cfg["tasks"]["suites"][0] |= {"format_reward": 0.2}
    cfg.pop("eval")
    config.write_text(yaml.safe_dump(cfg))
    assert _train(config)["steps"] == 1
    run = tmp_path / "runs" / "e2e"
    saved = torch.load(run / "checkpoints" / "step-000001" / "critic.pt")
    parts = build_trainer(load_config(config), DistContext())  # what a resumed job builds
    assert all(torch.equal(parts.critic.state_dict()[k], v) for k, v in saved.items())
    critic_params = {id(p) for p in parts.critic.parameters()}
    assert critic_params <= {id(p) for g in parts.optimizer.param_groups for p in g["params"]}
    cmd = [sys.executable, "-m", "launcher.cli", "train", str(config), "--quiet", "--set", "train.steps=2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "has no critic" not in out.stderr, "the critic was restored from the checkpoint"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "losses/value_loss" in r]
    assert trained and all("critic/value_before_mean" in r for r in trained)
    resumed = torch.load(run / "checkpoints" / "step-000002" / "critic.pt")
    assert resumed.keys() == saved.keys() == {"v.weight", "v.bias"}
