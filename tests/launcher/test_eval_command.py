"""``pqrl eval`` end to end in a subprocess, with every real part (the engine process serving the
real SmolLM2 or a saved checkpoint, the calc environment, an env server whose Docker is
unreachable): the table, the JSON, one JSONL line per task, the run's episode settings, exit 1 with
one line and no pass rate when no task ran, exit 2 with one line on bad input, nothing left behind."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
import yaml

from launcher.cli import main
from launcher.eval_command import resolve_checkpoint
from tasks.generators import Generate, generate_suite


def _suite(tmp_path: Path, kind: str, n: int) -> tuple[Path, list[str]]:
    """A generated suite named ``kind`` (so its default outcomes file is eval-KIND.jsonl)."""
    suite = generate_suite(Generate(kind, n=n, seed=7, name=kind))
    path = tmp_path / f"{kind}.jsonl"
    path.write_text(suite.to_jsonl())
    return path, [t.id for t in suite.tasks]


def _left(tag: str) -> list[int]:
    """Processes still running that inherited ``tag`` in their environment (the command's children)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if tag.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def _eval(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    tag = f"pqrl-eval-test-{uuid.uuid4().hex}"
    cmd = [sys.executable, "-m", "launcher.cli", "eval", *args, "--engine-threads", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=os.environ | {"PQRL_TEST_TAG": tag} | (env or {}))  # fmt: skip
    assert _left(tag) == [], "the engine and env server stop with the command"
    return out


@pytest.mark.timeout(300)
def test_the_base_model_on_a_calc_suite_gets_rates_intervals_and_a_line_per_task(tmp_path):
    suite, ids = _suite(tmp_path, "calc", 3)
    out = _eval(tmp_path, "--model", "smollm2-135m-instruct", str(suite), "--k", "2",
                "--max-new-tokens", "32", "--max-turns", "2")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout.splitlines()
    pass1 = next(ln for ln in table if ln.startswith("pass@1 "))
    pass2 = next(ln for ln in table if ln.startswith("pass@2 "))
    assert "95% CI [" in pass1 and "(Wilson)" in pass1 and "over 3 of 3 tasks" in pass1
    assert "95% CI [" in pass2 and "bootstrap" in pass2 and "2 samples each" in pass2
    assert any(ln.startswith("infra") and "0 of 9 episodes" in ln for ln in table)
    assert "9/9 episodes" in out.stderr, "progress on stderr"
    lines = [json.loads(ln) for ln in (tmp_path / "eval-calc.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in lines] == ids, "one line per task, in the suite's order"
    for r in lines:
        assert (
            len(r["samples"]) == 2 and r["greedy"]["failed_infra"] is False and 1 <= r["greedy"]["turns"] <= 2
        )
        assert r["greedy"]["passed"] == (r["greedy"]["reward"] >= 1.0) and 0.0 <= r["pass@2"] <= 1.0
    rate = float(pass1.split()[1])
    assert rate == round(sum(r["greedy"]["passed"] for r in lines) / 3, 3)


@pytest.mark.timeout(300)
def test_a_run_directory_is_evaluated_at_its_latest_checkpoint_with_the_runs_settings(tmp_path):
    from pqrl.model_cache import load_tokenizer
    from tests.models import tiny_llama
    from trainer.checkpoint import CheckpointState, save_checkpoint

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    config = {"run": "r", "tasks": {"suites": [{"generate": "calc", "n": 4}]},
              "rollout": {"max_turns": 1, "max_new_tokens": 8}}  # fmt: skip
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    tokenizer = load_tokenizer()
    model = tiny_llama(len(tokenizer), positions=2048)  # a calc prompt with its worked example fits
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in (2, 3):
        save_checkpoint(run / "checkpoints", CheckpointState(step=step), model=model, optimizer=optimizer,
                        tokenizer=tokenizer)  # fmt: skip
    latest = run / "checkpoints" / "step-000003"
    assert resolve_checkpoint(str(run)) == (latest, run)
    assert resolve_checkpoint(str(run / "checkpoints")) == (latest, run)
    assert resolve_checkpoint(str(run / "checkpoints" / "step-000002"))[0].name == "step-000002"

    suite, ids = _suite(tmp_path, "calc", 3)
    out = _eval(tmp_path, str(run), str(suite), "--k", "2", "--json", "--quiet", "-o", "out/tasks.jsonl")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr == "", "--quiet: nothing on stderr"
    result = json.loads(out.stdout)
    assert result["model"] == str(latest) and result["tasks"] == result["tasks_run"] == 3
    assert 0.0 <= result["pass@1_ci95"][0] <= result["pass@1"] <= result["pass@1_ci95"][1] <= 1.0
    assert result["pass@1_interval"] == "wilson" and result["pass@2_interval"] == "bootstrap"
    assert result["failed_infra"] == 0 and result["episodes"] == 9
    lines = [json.loads(ln) for ln in (tmp_path / "out" / "tasks.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in lines] == ids
    turns = [e["turns"] for r in lines for e in (r["greedy"], *r["samples"])]
    assert turns and max(turns) == 1, "the run's rollout.max_turns applies"


@pytest.mark.timeout(300)
def test_no_task_ran_exits_1_with_one_line_and_no_pass_rate(tmp_path):
    """The data suite's sandboxes need Docker; the env server's is unreachable: every episode fails
    on infrastructure, none is scored as a wrong answer."""
    suite, ids = _suite(tmp_path, "data", 3)
    nowhere = {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    out = _eval(tmp_path, "--model", "smollm2-135m-instruct", str(suite), "--k", "2", "--quiet",
                "--max-new-tokens", "16", env=nowhere)  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr[-3000:]
    assert out.stdout == "", "no pass rate printed"
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pqrl eval: no pass rate: no task ran: 3 of 3"), lines
    assert "Docker" in lines[0] and "eval-data.jsonl" in lines[0]
    records = [json.loads(ln) for ln in (tmp_path / "eval-data.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in records] == ids
    assert all(
        e["failed_infra"] and e["passed"] is None for r in records for e in (r["greedy"], *r["samples"])
    )


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    suite, _ = _suite(tmp_path, "calc", 2)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("run: r\n")
    bad_suite = tmp_path / "bad.jsonl"
    bad_suite.write_text('{"suite": {}}\n')
    cases = {
        "one of them": ["--model", "smollm2-135m-instruct", str(tmp_path), str(suite)],
        "CHECKPOINT or --model": [str(suite)],
        "no such directory": [str(tmp_path / "nowhere"), str(suite)],
        "no checkpoint yet": [str(tmp_path / "run"), str(suite)],
        "neither a checkpoint nor a run": [str(tmp_path), str(suite)],
        "unknown model": ["--model", "no-such-model", str(suite)],
        "no config.json": ["--model", str(tmp_path / "run"), str(suite)],
        "problem(s)": ["--model", "smollm2-135m-instruct", str(bad_suite)],
        "samples >= k": ["--model", "smollm2-135m-instruct", str(suite), "--k", "3", "--samples", "2"],
        "--max-failed-infra": ["--model", "smollm2-135m-instruct", str(suite), "--max-failed-infra", "2"],
    }
    for said, argv in cases.items():
        assert main(["eval", *argv]) == 2, said
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert captured.out == "" and len(lines) == 1 and lines[0].startswith("pqrl eval: "), (said, lines)
        assert said in lines[0], (said, lines[0])


def test_a_refused_pass_at_k_is_shown_as_none_with_its_reason_beside_pass_at_1():
    from agent_loop.difficulty import Sample
    from agent_loop.evaluation import TaskOutcome, summarize
    from launcher.eval_command import _report, _table, _Target

    ok, wrong, infra = Sample(1.0, turns=1), Sample(0.0, turns=1), Sample(0.0, True, 0, "sandbox gone")
    tasks = [TaskOutcome("a", ok, (infra, infra)), TaskOutcome("b", wrong, (wrong, infra)),
             TaskOutcome("c", ok, (ok, ok)), TaskOutcome("d", wrong, (wrong, wrong))]  # fmt: skip
    suite = generate_suite(Generate("calc", n=1, seed=7, name="calc"))
    report = _report(summarize(tasks, k=2), _Target("m", "m", None), suite,
                     argparse.Namespace(k=2, samples=None), Path("o.jsonl"))  # fmt: skip
    assert report["pass@1"] == 0.5 and "pass@2" not in report and report["tasks_run@k"] == 2
    assert report["refused"]["pass@2"].startswith("2 of 4 tasks failed on infrastructure")
    table = _table(report).splitlines()
    assert table[2].startswith("pass@1    0.500   95% CI [0.150, 0.850] (Wilson)")
    assert table[3].startswith("pass@2    none: 2 of 4 tasks failed") and "sandbox gone" in table[3]
    assert table[4] == "infra     3 of 12 episodes failed on infrastructure"


@pytest.mark.timeout(300)
def test_an_engine_that_cannot_load_its_model_ends_the_command_with_one_line_naming_it(tmp_path):
    suite, _ = _suite(tmp_path, "calc", 2)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    out = _eval(tmp_path, "--model", str(broken), str(suite), "--quiet")
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pqrl eval: the engine (pid "), lines
    assert "exited with status" in lines[0]
