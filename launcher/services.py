"""The services a training job talks to: the configured URLs, or (embedded mode) a private Redis whose
data lives in the run directory, so a killed job resumes with its stream, the built-in engine in a
process of its own, and, when a suite's environment needs sandboxes, a private env server process
(token on, loopback only) that keeps the warm sandbox pool; all of them die with this one.
Environments without sandboxes run in the job's own process."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from launcher.children import Children, progress_every_s, tail
from launcher.jobconfig import TrainConfig
from launcher.precision import Dtype, cpu_bfloat16
from pqrl.envvars import setting
from pqrl.redis_server import RedisServer, die_with_parent, free_port, stop_process

__all__ = [
    "engine_process",
    "env_server_process",
    "job_services",
    "needing_sandbox",
    "sandboxed_envs",
]


@contextlib.contextmanager
def job_services(cfg: TrainConfig, *, quiet: bool = False) -> Iterator[dict[str, Any]]:
    """Redis, engine and env-server URLs: the configured ones, or private ones started (and stopped) here,
    with ``children``: those processes, watched (see ``launcher.children``)."""
    env_token = cfg.services.env_token or setting("PQRL_ENV_TOKEN")
    if cfg.services.engine == "vllm" and cfg.services.weight_sync.method != "disk":
        from pqrl.errors import UsageError

        raise UsageError(
            "services.engine vllm takes new weights from disk: set services.weight_sync.method: disk"
        )
    if not cfg.embedded:
        yield {"redis_url": cfg.services.redis_url, "engines": cfg.services.engines,
               "env_servers": cfg.services.env_servers, "env_token": env_token}  # fmt: skip
        return
    with contextlib.ExitStack() as stack:
        children = Children(quiet=quiet)
        redis = stack.enter_context(RedisServer(data_dir=cfg.run_dir / "redis", die_with_parent=True))
        assert redis.proc is not None
        children.add("Redis server", redis.proc, redis.log_path)
        engines = list(cfg.services.engines)
        if not engines:
            port = free_port()
            how = {"seed": cfg.seed, "threads": cfg.services.engine_threads, "dtype": cfg.model.dtype,
                   "backend": cfg.services.engine}  # fmt: skip
            engine = stack.enter_context(
                engine_process(cfg.model.name, port, cfg.run_dir / "engine.log", **how)
            )
            children.add("engine", engine, cfg.run_dir / "engine.log")
            engines = [f"http://127.0.0.1:{port}"]
        env_servers = list(cfg.services.env_servers)
        if not env_servers and sandboxed_envs(cfg):
            env_token = secrets.token_urlsafe(24)
            pool = cfg.services.sandbox_pool or cfg.rollout.group_size * cfg.rollout.max_concurrent_groups
            log = cfg.run_dir / "env_server.log"
            env_servers = [stack.enter_context(env_server_process(log, env_token, pool, children=children))]
        services = {"redis_url": redis.url, "engines": engines, "env_servers": env_servers}
        (cfg.run_dir / "services.json").write_text(json.dumps(services))
        try:
            yield services | {"env_token": env_token, "children": children}
        finally:
            (cfg.run_dir / "services.json").unlink(missing_ok=True)


def sandboxed_envs(cfg: TrainConfig) -> list[str]:
    """The environments of the job's suites (training and evaluation) that need a sandbox."""
    from env_server.registry import UnknownEnvironment
    from pqrl.errors import PermanentFault
    from pqrl.faults import fix_for_code
    from tasks.generators import GENERATED

    refs = [*cfg.tasks.suites, *([cfg.eval.suite] if cfg.eval.suite else [])]
    # a generated suite's environment is known from its kind: no need to build it here too
    try:
        env_ids = [GENERATED[r.generate] if r.generate else r.build().manifest.env_id for r in refs]
        return needing_sandbox(env_ids)
    except UnknownEnvironment as e:  # every task of it would fail the same way
        raise PermanentFault(str(e), fix=fix_for_code("unknown_environment")) from None


def needing_sandbox(env_ids: Iterable[str]) -> list[str]:
    """The environments among ``env_ids`` that need a sandbox (so a private env server), sorted."""
    from env_server.registry import spec

    return [e for e in sorted(set(env_ids)) if spec(e).load().needs_sandbox]


def _service_process(log: Path, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A child that appends to ``log``, ignores the terminal's Ctrl-C and dies with this process."""
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip


@contextlib.contextmanager
def env_server_process(
    log: Path, token: str, pool: int, run: str = "env-server", children: Children | None = None
) -> Iterator[str]:
    """``pqrl env-server`` on a free loopback port with ``token`` and ``pool`` warm sandboxes labelled
    ``run``; yields its URL once it answers (joined to ``children``), stops it (and so its sandboxes)
    on exit."""
    port = free_port()
    env = os.environ | {"PQRL_ENV_TOKEN": token, "PQRL_ENV_SANDBOX_POOL_SIZE": str(pool), "PQRL_ENV_RUN": run}
    cmd = [sys.executable, "-m", "launcher.cli", "env-server", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning"]  # fmt: skip
    proc = _service_process(log, cmd, env)
    url = f"http://127.0.0.1:{port}"
    try:
        watched = children or Children()
        wait_for_health(url + "/healthz", proc, timeout_s=60, what="env server", log=log,
                        quiet=watched.quiet, command=watched.command)  # fmt: skip
        if children is not None:
            children.add("env server", proc, log)
        yield url
    finally:
        stop_process(proc)


def wait_for_health(
    url: str,
    proc: subprocess.Popen[bytes],
    *,
    timeout_s: float,
    what: str,
    log: Path,
    quiet: bool = False,
    command: str = "pqrl train",
) -> None:
    """Polls ``url`` until it answers 200, saying so every few seconds; fails at once if the child
    exits, with its status and the last lines of ``log``."""
    import httpx

    t0 = told = time.monotonic()
    while proc.poll() is None and time.monotonic() < t0 + timeout_s:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        if not quiet and time.monotonic() - told >= progress_every_s:
            told = time.monotonic()
            print(f"{command}: waiting for the {what}: {told - t0:.0f} s", file=sys.stderr, flush=True)
        time.sleep(0.2)
    watched = Children(command=command)
    watched.add(what, proc, log)
    silent = f"{command}: the {what} is silent after {timeout_s:.0f} s; {tail(log)}"
    raise watched.death() or SystemExit(silent)


@contextlib.contextmanager
def engine_process(
    model: str,
    port: int,
    log: Path,
    *,
    seed: int = 0,
    threads: int = 1,
    dtype: Dtype = "auto",
    backend: str = "builtin",
) -> Iterator[subprocess.Popen[bytes]]:
    """The engine (``backend``: builtin or vllm) serving ``model`` on ``port``; the caller awaits its
    health (the job in ``Job.__aenter__``), watching it. Stopping it stops its whole process group
    (vLLM runs its engine core and workers in processes of their own)."""
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "launcher.cli", "engine", "serve", "--backend", backend,
           "--model", model, "--port", str(port), "--seed", str(seed)]  # fmt: skip
    if backend == "builtin" and cpu_bfloat16(
        dtype
    ):  # sample from the products the trainer's autocast scores with
        cmd += ["--matmul-dtype", "bfloat16"]
    proc = _service_process(log, cmd, env)
    try:
        yield proc
    finally:
        stop_process(proc)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what it left behind (its own session, see above)
