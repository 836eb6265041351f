"""The services a training job talks to: the configured URLs, or (embedded mode) a private Redis whose
data lives in the run directory, so a killed job resumes with its stream, and the built-in engine in
a process of its own, both dying with this one."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from launcher.jobconfig import TrainConfig
from pqrl.redis_server import RedisServer, die_with_parent, free_port, stop_process

__all__ = ["job_services"]


@contextlib.contextmanager
def job_services(cfg: TrainConfig) -> Iterator[dict[str, Any]]:
    """Redis and engine URLs: the configured ones, or private ones started (and stopped) here."""
    if not cfg.embedded:
        yield {"redis_url": cfg.services.redis_url, "engines": cfg.services.engines}
        return
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(RedisServer(data_dir=cfg.run_dir / "redis", die_with_parent=True))
        engines = list(cfg.services.engines)
        if not engines:
            port = free_port()
            stack.enter_context(_engine_process(cfg, port))
            engines = [f"http://127.0.0.1:{port}"]
        (cfg.run_dir / "services.json").write_text(json.dumps({"redis_url": redis.url, "engines": engines}))
        try:
            yield {"redis_url": redis.url, "engines": engines}
        finally:
            (cfg.run_dir / "services.json").unlink(missing_ok=True)


@contextlib.contextmanager
def _engine_process(cfg: TrainConfig, port: int) -> Iterator[subprocess.Popen[bytes]]:
    threads = str(cfg.services.engine_threads)
    env = os.environ | {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    cmd = [sys.executable, "-m", "launcher.cli", "engine", "serve", "--backend", "builtin",
           "--model", cfg.model.name, "--port", str(port), "--seed", str(cfg.seed)]  # fmt: skip
    with open(cfg.run_dir / "engine.log", "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip
    try:
        yield proc
    finally:
        stop_process(proc)
