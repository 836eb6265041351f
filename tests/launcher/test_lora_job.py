"""``model.lora`` jobs: the trainer trains adapters only, checkpoints hold the adapter (and its optimizer
state) only, a run killed between checkpoints resumes to the same adapter as one never interrupted,
and a bad LoRA config is a one-line exit 2. Real ``pqrl train`` processes, a real Redis, a tiny model
on disk; the embedded end-to-end job (real engine process) is ``test_embedded_lora_job``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.launcher.test_resume import _fill, _train

STEPS = 6


def _config(path: Path, model: Path, redis_url: str, out: Path, **lora: object) -> Path:
    cfg = {
        "run": "r",
        "output_dir": str(out),
        "tensorboard": False,
        "model": {"name": str(model), "dtype": "float32", "lora": {"rank": 4, "alpha": 8} | lora},
        "services": {"redis_url": redis_url},
        "tasks": {"suites": [{"generate": "calc", "n": 4}]},
        "rollout": {"max_staleness": 1000},
        # KL in the loss: its reference is the policy with its adapters off
        "algorithm": {"kl_coef": 0.05},
        "train": {"steps": STEPS, "groups_per_step": 2, "lr": 1e-2, "read_timeout_s": 20,
                  "gradient_checkpointing": True},
        "checkpoint": {"every": 2, "keep": 2},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(cfg))
    return path


def _final(out: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    ckpt = out / "r" / "checkpoints"
    final = ckpt / (ckpt / "latest").read_text().strip()
    return final, load_file(final / "model" / "adapter_model.safetensors")


@pytest.mark.timeout(900)  # three trainer processes: about 30 s each on 2 idle cores, minutes on a busy one
def test_a_lora_run_checkpoints_the_adapter_only_and_resumes_identically(tiny_model_dir, tmp_path):
    from pqrl.redis_server import RedisServer

    with RedisServer(data_dir=tmp_path / "redis-ref", appendfsync="always") as redis:
        asyncio.run(_fill(redis.url))
        assert _train(_config(tmp_path / "ref.yaml", tiny_model_dir, redis.url, tmp_path / "ref")) == 0
    final, ref = _final(tmp_path / "ref")
    files = sorted(p.name for p in (final / "model").iterdir())
    assert "adapter_config.json" in files and "adapter_model.safetensors" in files
    assert not [f for f in files if f.startswith("model") or f == "config.json"], (
        f"base weights saved: {files}"
    )
    assert (
        all(".lora_A." in k or ".lora_B." in k for k in ref) and len(ref) == 2 * 7 * 2
    )  # 7 targets, 2 layers
    assert max(float(t.abs().max()) for k, t in ref.items() if ".lora_B." in k) > 0, "the adapters trained"
    opt = torch.load(final / "trainer_state.pt", weights_only=False)["optimizer"]
    moments = sum(s["exp_avg"].numel() for s in opt["state"].values())
    assert moments == sum(t.numel() for t in ref.values()), "optimizer state for adapter parameters only"
    config = json.loads((final / "model" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8, "LORA")

    with RedisServer(data_dir=tmp_path / "redis", appendfsync="always") as redis:
        asyncio.run(_fill(redis.url))
        config_path = _config(tmp_path / "job.yaml", tiny_model_dir, redis.url, tmp_path / "out")
        assert _train(config_path, failpoint="trained:3") == 137  # after checkpoint 2, before 4
        assert _train(config_path) == 0
    _, resumed = _final(tmp_path / "out")
    diff = max(float((resumed[k] - ref[k]).abs().max()) for k in ref)
    assert diff < 1e-6, f"the resumed adapter differs from the uninterrupted run's by {diff}"


def test_the_adapter_loads_as_a_model_with_its_base(tiny_model_dir, tmp_path):
    """``pqrl eval`` / a fresh engine take a LoRA checkpoint as its base with the adapter merged."""
    from launcher.lora_config import LoraSection
    from pqrl.model_cache import load_model
    from trainer.lora import apply_lora, save_weights

    base = load_model(str(tiny_model_dir), dtype=torch.float32)
    model = apply_lora(
        load_model(str(tiny_model_dir), dtype=torch.float32), LoraSection(rank=2), base=str(tiny_model_dir)
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.normal_(0, 0.5)
    save_weights(model, tmp_path / "adapter")
    merged = load_model(str(tmp_path / "adapter"), dtype=torch.float32)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want, got, plain = (m.eval()(ids).logits for m in (model, merged, base))
    assert float((want - got).abs().max()) < 1e-4 and float((want - plain).abs().max()) > 1e-3


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"rank": 0, "alpha": 8}, "rank is 0"),
        ({"rank": -1}, "greater than or equal to 0"),
        ({"rank": 4, "dropout": 0.1}, "dropout must be 0.0"),
        ({"rank": 4, "target_modules": []}, "at least 1 item"),
        ({"rank": 4, "target_modules": ["q proj"]}, "not module names"),
        ({"rank": 4, "rnak": 3}, "Extra inputs"),
    ],
)
def test_a_bad_lora_config_is_one_line_and_exit_2(tmp_path, lora, message):
    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump({"run": "r", "model": {"lora": lora}, "tasks": {"suites": [{"generate": "calc"}]}})
    )
    out = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "train", str(path)], capture_output=True, text=True
    )
    assert out.returncode == 2 and message in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("lora", "services", "message"),
    [
        ({}, {"weight_sync": {"method": "distributed"}}, "weight_sync.method: disk"),
        # vLLM loads whole weights: an adapter directory would fail at the first sync
        ({"publish": "adapter"}, {"engine": "vllm"}, "set model.lora.publish: merged"),
    ],
)
def test_lora_with_what_cannot_take_an_adapter_is_refused(tmp_path, lora, services, message):
    path = tmp_path / "job.yaml"
    cfg = {"run": "r", "model": {"lora": {"rank": 4} | lora}, "tasks": {"suites": [{"generate": "calc"}]},
           "services": services}  # fmt: skip
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "train", str(path)], capture_output=True, text=True
    )
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_targets_the_model_lacks_are_one_line_and_exit_2(tiny_model_dir, tmp_path):
    from pqrl.redis_server import RedisServer

    with RedisServer(data_dir=tmp_path / "redis") as redis:
        config = _config(tmp_path / "job.yaml", tiny_model_dir, redis.url, tmp_path / "out",
                         target_modules=["q_proj", "c_attn", "embed_tokens"])  # fmt: skip
        cmd = [sys.executable, "-m", "launcher.cli", "train", str(config), "--role", "trainer", "--quiet"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(lines) <= 2 and "'c_attn' matches no layer" in out.stderr and "Embedding" in out.stderr, (
        out.stderr
    )


@pytest.mark.timeout(1800)  # two whole embedded jobs on SmolLM2: minutes on 2 idle cores, more on a busy one
def test_embedded_lora_job_syncs_adapters_to_its_engine_and_resumes(tmp_path):
    """Every real part: a private Redis, an engine process that merges each published adapter, the
    calc environment, the rollout manager and the trainer; then resumed, the engine process starting
    from the base weights again and served the checkpoint's adapter."""
    from tests.launcher.test_train_job import _job
    from tests.launcher.test_train_job import _train as train_job

    config = _job(tmp_path)
    lora = [
        "--set",
        'model.lora={"rank": 8, "alpha": 16}',
        "--set",
        "train.lr=1e-3",
        "--set",
        "train.report_to=[]",
    ]
    first = train_job(config, *lora)
    run = tmp_path / "runs" / "e2e"
    assert first["steps"] == 1 and first["policy_version"] >= 1 and "eval_after" in first
    model_dir = run / "checkpoints" / "step-000001" / "model"
    files = sorted(p.name for p in model_dir.iterdir())
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(files)
    assert not [f for f in files if f.startswith("model") or f == "config.json"], (
        f"base weights saved: {files}"
    )
    assert not (run / "services.json").exists(), "the private services are gone after the job"

    second = train_job(config, *lora, "--set", "train.steps=2")
    assert second["steps"] == 2 and second["policy_version"] > first["policy_version"]
    from safetensors.torch import load_file

    a, b = (
        load_file(run / "checkpoints" / f"step-00000{s}" / "model" / "adapter_model.safetensors")
        for s in (1, 2)
    )
    assert any(not torch.equal(a[k], b[k]) for k in a), "the resumed run trained the adapter further"


def test_pqrl_eval_takes_a_lora_checkpoint(tmp_path):
    from launcher.eval_command import resolve_checkpoint

    ckpt = tmp_path / "checkpoints" / "step-000002"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "model" / "adapter_config.json").write_text("{}")
    assert resolve_checkpoint(str(ckpt))[0] == ckpt
    (ckpt / "model" / "adapter_config.json").unlink()
    with pytest.raises(Exception, match="neither a checkpoint nor a run directory"):
        resolve_checkpoint(str(ckpt))
