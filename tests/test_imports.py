"""Compute modules import with only torch, transformers and numpy present (e.g. on a bare GPU box)."""

from __future__ import annotations

import subprocess
import sys

BLOCKED = ["redis", "fastapi", "uvicorn", "httpx", "docker", "pydantic", "msgpack", "yaml"]
COMPUTE_MODULES = [
    "pqrl",
    "pqrl.trajectory",
    "pqrl.model_cache",
    "trainer.losses",
    "trainer.objective",
    "trainer.advantages",
    "trainer.screening",
    "trainer.batch",
    "trainer.step",
    "engine.sampling_params",
    "engine.config",
    "engine.token_sampling",
    "engine.weights_loading",
    "engine.batcher",
    "engine.scheduler",
]


def test_compute_modules_need_only_torch_transformers_numpy():
    code = (
        "import sys\n"
        f"for name in {BLOCKED!r}:\n"
        "    sys.modules[name] = None  # any import of these now raises ImportError\n"
        f"for mod in {COMPUTE_MODULES!r}:\n"
        "    __import__(mod)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_blocking_really_blocks():
    code = "import sys; sys.modules['msgpack'] = None; import pqrl.codec"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "import of msgpack halted" in out.stderr
