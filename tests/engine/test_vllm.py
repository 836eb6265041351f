"""vLLM as pqrl's engine, for real: a vLLM server (``pqrl engine serve --backend vllm``) generating
from token ids with logprobs and per-token versions, taking new weights from disk mid-generation
and serving them; and a short ``pqrl train`` job whose embedded engine is vLLM (rollouts, one
trained step, the weight update pushed to it). No process may be left behind.

Skips only where vLLM cannot run: not installed (``PQRL_SETUP_ENGINES=vllm bash scripts/setup.sh``) or an
x86 CPU without AVX2 (the wheel's kernels are built for AVX2, AVX512 and AVX512-BF16; it picks one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from engine.sampling_params import SamplingParams
from engine.vllm import vllm_python
from engine.vllm_client import VLLMClient
from pqrl.model_cache import prepare_model
from pqrl.redis_server import free_port, stop_process


def _why_not() -> str | None:
    if vllm_python() is None:
        return "vLLM is not installed: PQRL_SETUP_ENGINES=vllm bash scripts/setup.sh installs it"
    if platform.machine() in ("x86_64", "AMD64"):
        flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
        if "avx2" not in flags:
            return "vLLM's CPU kernels need AVX2 at least; this CPU has none (GPU machines run this test)"
    return None


needs_vllm = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")
pytestmark = pytest.mark.timeout(1200)


def _assert_gone(log: str) -> None:
    """Every process vLLM's log names (its API server, engine core and workers) has exited."""
    pids = {int(p) for p in re.findall(r"\((?:APIServer|EngineCore|\w*Worker[-\w]*) pid=(\d+)\)", log)}
    assert pids, "vLLM's log names no process"

    def alive() -> set[int]:
        return {
            p
            for p in pids
            if Path(f"/proc/{p}").exists() and " Z " not in Path(f"/proc/{p}/stat").read_text()
        }

    deadline = time.monotonic() + 30
    while alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(), f"vLLM processes left behind: {alive()}"


def _changed_checkpoint(src: Path, dst: Path) -> Path:
    """A copy of the model with its (tied) embedding perturbed: same architecture, other numbers,
    and no ``lm_head.weight`` in the file, as the trainer saves it."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    (weights,) = dst.glob("*.safetensors")
    tensors = load_file(weights)
    assert "lm_head.weight" not in tensors, "SmolLM2 ties its output head to the embedding"
    embed = tensors["model.embed_tokens.weight"]
    noise = torch.randn(embed.shape, generator=torch.Generator().manual_seed(0))
    tensors["model.embed_tokens.weight"] = embed * (1 + 0.3 * noise)
    save_file(tensors, weights, metadata={"format": "pt"})
    return dst


def _reference_logprobs(model_dir: Path, prompt: list[int], out: list[int]) -> list[float]:
    """transformers' float32 logprobs of ``out`` after ``prompt`` (temperature 1)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(out)[:, None])[:, 0].tolist()


def _far(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def _job(tmp_path: Path, **model: object) -> Path:
    cfg = {
        "model": model,
        "run": "vllm", "output_dir": str(tmp_path / "runs"),
        "tasks": {"suites": [{"generate": "calc", "level": 1, "n": 8, "shots": 2, "format_reward": 0.2}]},
        "rollout": {"group_size": 4, "max_turns": 1, "max_new_tokens": 32, "max_total_tokens": 1024,
                    "max_concurrent_groups": 2, "temperature": 0.7},
        "train": {"steps": 1, "groups_per_step": 1, "lr": 1e-5, "read_timeout_s": 900, "max_extra_reads": 15},
        "services": {"engine": "vllm"},
    }  # fmt: skip
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path / "job.yaml"


def test_a_vllm_engine_that_cannot_start_ends_the_job_with_its_cause(tmp_path):
    """No vLLM where PQRL_VLLM_PYTHON points: the engine process exits 2 saying so, and the job ends
    with that line and status 2 (bad input), not with a health timeout."""
    cmd = [sys.executable, "-m", "launcher.cli", "train", str(_job(tmp_path)), "--quiet"]
    env = os.environ | {"PQRL_VLLM_PYTHON": str(tmp_path / "no-such-python")}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "vLLM is not installed" in out.stderr and "PQRL_SETUP_ENGINES=vllm" in out.stderr, out.stderr[
        -3000:
    ]


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "engine.log"
    cmd = [sys.executable, "-m", "launcher.cli", "engine", "serve", "--backend", "vllm", "--port", str(port)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(_healthy(url, proc, log))
        yield url
    finally:
        stop_process(proc)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # as the job stops its engine: the whole group
        _assert_gone(log.read_text())


async def _healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    async with VLLMClient(url) as client:
        deadline = time.monotonic() + 900
        while not all((await client.health()).values()):
            assert proc.poll() is None, f"vLLM exited {proc.returncode}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(1)


@needs_vllm
def test_generation_weight_update_mid_generation_and_abort(vllm_url, tmp_path):
    changed = _changed_checkpoint(prepare_model(), tmp_path / "v1")
    prompt = [1, 504, 3458, 314, 260, 1345, 30]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)

    async def run() -> None:
        async with VLLMClient(vllm_url) as client:
            assert await client.get_weight_version() == {vllm_url: 0}
            base = await client.generate(prompt, greedy)
            assert (
                len(base.output_ids) == 12
                and base.versions == [0] * 12
                and base.finish_reason.type == "length"
            )
            assert all(lp <= 0 for lp in base.logprobs) and base.segments == 1
            assert _far(base.logprobs, _reference_logprobs(prepare_model(), prompt, base.output_ids)) < 0.5
            again = await client.generate(prompt, greedy)
            assert again.output_ids == base.output_ids, "greedy decoding is deterministic"

            # an update that lands mid-generation: the tokens before it are version 0, after it 1
            long = asyncio.create_task(
                client.generate(prompt, SamplingParams(max_new_tokens=600, ignore_eos=True, sampling_seed=5))
            )
            await asyncio.sleep(0.5)
            while client.in_flight[vllm_url] == 0:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            assert (await client.update_weights_from_disk(str(changed), 1))[0]["success"]
            gen = await long
            assert len(gen.output_ids) == 600 and len(gen.logprobs) == 600 and gen.segments >= 2
            switch = gen.versions.index(1)
            assert switch > 0 and gen.versions == [0] * switch + [1] * (600 - switch), "one switch, 0 to 1"

            served = await client.generate(prompt, greedy)
            assert served.versions == [1] * 12 and served.output_ids != base.output_ids
            # the new model's logprobs, output head included (bfloat16 kernels: tenths at most; an
            # output head left at the base weights is off by 20)
            assert _far(served.logprobs, _reference_logprobs(changed, prompt, served.output_ids)) < 0.5
            assert await client.get_weight_version() == {vllm_url: 1}
            assert await client.catch_up_from_disk(str(changed), 1) == [], "no server is behind"

            # abort: the generation ends with finish reason abort and is not resumed
            rid = "abort-me"
            endless = SamplingParams(max_new_tokens=2000, ignore_eos=True)
            job = asyncio.create_task(client.generate(prompt, endless, rid=rid))
            while client.in_flight[vllm_url] == 0:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            await client.abort(rid)
            aborted = await asyncio.wait_for(job, 120)
            assert aborted.finish_reason.type == "abort" and len(aborted.output_ids) < 2000

    asyncio.run(run())


@needs_vllm
@pytest.mark.parametrize("lora", [None, {"rank": 8}], ids=["whole", "lora"])
def test_a_job_with_a_vllm_engine_trains_and_updates_it(tmp_path, lora):
    """A whole-model job, and a LoRA job whose syncs carry the adapter merged into whole weights
    (``model.lora.publish: auto``): vLLM takes in both and serves them as the next version."""
    config = _job(tmp_path, **({"lora": lora} if lora else {}))
    cmd = [sys.executable, "-m", "launcher.cli", "train", str(config), "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1100)
    run = tmp_path / "runs" / "vllm"
    log = (run / "engine.log").read_text() if (run / "engine.log").exists() else ""
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:] + log[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1 and summary["policy_version"] == 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (trained,) = [r for r in rows if "rollout/groups" in r]
    assert trained.get("rollout/trajectories_used", 0) > 0 and "losses/pg_loss" in trained, trained
    # the trainer scored vLLM's tokens: its logprobs disagree a little (other kernels, bfloat16); the
    # built-in engine's agree to about 1e-7. A k1 estimate: either sign.
    assert 1e-6 < abs(trained["offpolicy/mismatch_kl"]) < 0.5, {
        k: v for k, v in trained.items() if "offpolicy" in k
    }
    assert "V1 LLM engine (v0.32.0)" in log, "the engine was vLLM"
    assert "Reloading weights inplace" in log, "the trained weights were pushed to vLLM"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["packages"]["vllm"] == "0.32.0" and manifest["config"]["services"]["engine"] == "vllm"
    if lora:  # the run's checkpoint still holds the adapter alone; only the engine got whole weights
        final = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip() / "model"
        assert (final / "adapter_config.json").is_file() and not (final / "config.json").exists()
    _assert_gone(log)


@pytest.mark.parametrize("extra", [["--host=0.0.0.0"], ["--host", "0.0.0.0"], ["--uds", "/tmp/v.sock"]])
def test_extra_arguments_cannot_move_vllm_off_loopback(extra):
    """vLLM's weight routes take no key: argparse keeps the last --host, so extra arguments that
    name another listener are refused before anything starts."""
    from engine.config import EngineConfig, ServeConfig
    from engine.vllm import launch_vllm

    with pytest.raises(ValueError, match="give the address with --host/--port"):
        launch_vllm(EngineConfig(), ServeConfig(engine_args=tuple(extra)))
