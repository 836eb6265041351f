"""A training job on real-repository tasks as a user runs one: a git repository imported as a
SWE-bench style suite (an image built from it), checked with ``pqrl tasks validate --check``, a
short ``pqrl sft`` on the suite's own demonstrations (its worked examples played in sandboxes),
then ``pqrl train`` from examples/repo.yaml starting from that checkpoint, with every part real
(the model in an engine process, a private Redis and env server, Docker sandboxes of the
repository's image). What must hold: the model's own tool calls ran against the repository (read
back from the run's rollout log), the episodes were graded 0 or 1 by its hidden tests with the
reason recorded, the job ended with its summary and exit 0, and nothing of it is left running.

The model is a tiny random Llama with SmolLM2's tokenizer and chat template: a base model writes
no tool call on a repo-v1 prompt, and an SFT step of SmolLM2-135M on these prompts took 164 s on
the shared 2-core machine; the tiny one takes the same path (demonstrations, SFT, the engine,
the agent loop) at a fraction of a second a step. The recipe is the same for a real model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.launcher.test_fail_fast import _processes_mentioning
from tests.sandboxes.test_recipes import _git
from tests.tasks.test_repo_env import F2P, GOLD, HIDDEN, P2P

pytestmark = pytest.mark.timeout(1800)  # about 5 minutes on 2 idle cores; a shared machine takes longer

ROOT = Path(__file__).resolve().parents[2]


def _pqrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "launcher.cli", *args]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=dict(os.environ)
    )


@pytest.fixture
def suite(tmp_path: Path) -> Iterator[Path]:
    """A repository (DIR/acme__mathx: mul adds) imported as two tasks; its image removed after."""
    repo = tmp_path / "repos" / "acme__mathx"
    (repo / "mathx").mkdir(parents=True)
    (repo / "tests").mkdir()
    marker = uuid.uuid4().hex  # a fresh image, so the one removed after is this test's
    (repo / "mathx" / "__init__.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n"
    )
    (repo / "tests" / "test_basic.py").write_text(
        "from mathx import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    (repo / "README.md").write_text(f"# mathx {marker}\n")
    _git(repo.parent, "init", "-q", "-b", "main", "acme__mathx")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    issues = ["mathx: mul(3, 4) returns 7 instead of 12", "mathx.mul adds its arguments"]
    instances = [
        {"instance_id": f"acme__mathx-{i}", "repo": "acme/mathx", "base_commit": base,
         "problem_statement": issue, "patch": GOLD, "test_patch": HIDDEN,
         "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P}
        for i, issue in enumerate(issues)
    ]  # fmt: skip
    src = tmp_path / "instances.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in instances))
    out = tmp_path / "repo-suite.jsonl"
    r = _pqrl("tasks", "import", "swebench", str(src), "-o", str(out), "--repos", str(repo.parent))
    assert r.returncode == 0, r.stdout + r.stderr
    image = json.loads(out.read_text().splitlines()[1])["image"]
    yield out
    subprocess.run(["docker", "rmi", "-f", image], capture_output=True)


def _left(run: str, where: Path) -> tuple[list[str], list[str]]:
    """(containers labelled with the run, processes whose command line or folder names ``where``)."""
    ps = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=pqrl.run={run}"], capture_output=True, text=True
    )
    return ps.stdout.split(), _processes_mentioning(where)


def _tiny_model(path: Path) -> Path:
    """A 2-layer Llama with SmolLM2's tokenizer and chat template, random weights, saved at ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pqrl.model_cache import load_tokenizer

    torch.manual_seed(0)
    tok = load_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)  # fmt: skip
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _sft(suite: Path, tmp_path: Path) -> Path:
    """``pqrl sft --demonstrations suite:FILE``: the worked examples (write the gold patch, git
    apply it, submit) in the format the job parses, until the tiny model has them by heart."""
    out = tmp_path / "sft"
    cfg = {"model": {"name": str(_tiny_model(tmp_path / "base")), "tool_parser": "hermes"},
           "demonstrations": "set-on-the-command-line", "output_dir": str(out), "epochs": SFT_STEPS,
           "batch_size": 2, "lr": 1.0e-2, "schedule": "constant", "device": "cpu"}  # fmt: skip
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump(cfg))
    r = _pqrl("sft", str(tmp_path / "sft.yaml"), "--demonstrations", f"suite:{suite}", "--quiet", timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    losses = [
        json.loads(line)["losses/sft_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(losses) == SFT_STEPS and losses[-1] < 0.05 < losses[0], losses
    return out


SFT_STEPS = 60  # batches of the 2 demonstrations


def _observations(row: dict, vocab: list[str]) -> list[str]:
    """The text after each turn of a rollout-log row, up to the next turn (its tool messages)."""
    turns, tokens = json.loads(row["turns"]), row["tokens"]
    ends = [u["end"] for u in turns]
    starts = [u["start"] for u in turns[1:]] + [len(tokens)]
    return ["".join(vocab[i] for i in tokens[a:b]) for a, b in zip(ends, starts, strict=True)]


def test_a_repo_suite_trains_through_pqrl_train_and_leaves_nothing(suite, tmp_path):
    check = _pqrl("tasks", "validate", "--check", "--jobs", "2", str(suite), timeout=900)
    # the worked example acts on the repository with the tools (write_file, run git apply, submit)
    assert check.returncode == 0 and "all 2 task(s) pass --check" in check.stdout, check.stdout + check.stderr
    sft = _sft(suite, tmp_path)

    cfg = yaml.safe_load((ROOT / "examples" / "repo.yaml").read_text())  # the shipped example, made small
    run = f"repo-{uuid.uuid4().hex[:8]}"
    cfg |= {"run": run, "output_dir": str(tmp_path / "runs")}
    cfg["model"] = {"name": str(sft), "tool_parser": "hermes"}  # the section the SFT config had
    cfg["tasks"]["suites"][0] |= {"path": str(suite), "defaults": {"shots": 0, "test_timeout": 240}}
    cfg["rollout"] |= {"group_size": 2, "max_concurrent_groups": 2, "max_turns": 4, "max_new_tokens": 256,
                       "max_total_tokens": 4096, "episode_deadline_s": 400, "temperature": 0.3}  # fmt: skip
    # one step of one group: with no signal (all rewards equal) it reads one more, then ends unchanged
    cfg["train"] |= {"steps": 1, "groups_per_step": 1, "max_extra_reads": 1, "read_timeout_s": 600}
    cfg["checkpoint"] = {"every": 1}
    config = tmp_path / "repo.yaml"
    config.write_text(yaml.safe_dump(cfg))

    r = _pqrl("train", str(config), "--quiet", timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["run"] == run and summary["steps"] == 1 and summary["exit_code"] == 0, summary
    assert summary["ended"].startswith("done"), summary
    out = tmp_path / "runs" / run
    assert (out / "checkpoints" / "latest").read_text() == "step-000001"
    assert _left(run, tmp_path) == ([], []), "the job left containers or processes"

    logged = sorted((out / "rollouts").glob("step-*.parquet"))
    rows = [row for f in logged for row in pq.read_table(f).to_pylist()]  # every episode the trainer read
    vocab = json.loads((out / "rollouts" / "vocab.json").read_text())
    assert rows and {row["env"] for row in rows} == {"repo-v1"}
    applied = 0
    for row in rows:
        info = json.loads(row["reward_info"])
        assert row["status"] in ("completed", "truncated") and row["num_generated"] > 0, row["status"]
        assert row["reward"] in (0.0, 1.0) and info["instance_id"].startswith("acme__mathx-"), info
        if row["reward"] == 0.0:  # the reason, from the hidden tests run on the repository's files
            assert info["reason"], info
        calls = [c for u in json.loads(row["turns"]) for c in u["tool_calls"]]
        for turn, seen in zip(json.loads(row["turns"]), _observations(row, vocab), strict=True):
            for c in turn["tool_calls"]:
                # the model's own call ran in the repository: its patch applied to /workspace's files
                if c["name"] == "run" and c["arguments"].get("command", "").startswith("git apply"):
                    applied += c["status"] == "ok" and "[exit code 0]" in seen
        if row["reward"] == 1.0:  # its hidden tests passed on the diff its own calls made
            assert info["patch_bytes"] > 0 and [c["name"] for c in calls][-1] == "submit", (info, calls)
    assert applied >= 1, [json.loads(row["turns"]) for row in rows]
    assert any(row["reward"] == 1.0 for row in rows), [row["reward_info"] for row in rows]
    assert _left(run, tmp_path) == ([], []), "reading the rollout log left something running"
