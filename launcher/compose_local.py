"""compose.yaml's services as processes on this machine: each service's own command and environment,
as ``docker-compose config`` resolves them, with service host names mapped to loopback ports and the
``/config`` and ``/runs`` mounts to local directories. What the topology test and the chaos benchmark
run, so both exercise the commands a deployment runs; also a way to run the topology where no image
registry is reachable (``docker compose up`` needs ``redis:7`` and a Python base image).

Services can be started several times under names like ``rollout-1`` (as ``--scale rollout=2``),
killed and restarted; each one's output goes to ``LOGS/NAME.log`` (appended across restarts).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from pqrl.redis_server import free_port, stop_process

__all__ = ["LocalTopology", "resolved_services"]

ROOT = Path(__file__).resolve().parents[1]
_ADDRESSES = {
    "redis": "redis://redis:6379",
    "engine": "http://engine:30000",
    "env-server": "http://env-server:8100",
}


def resolved_services(env: dict[str, str], *files: str) -> dict:
    """The compose files' services as docker-compose resolves them (anchors merged, variables set)."""
    exe = shutil.which("docker-compose")
    cmd = [exe] if exe else ["docker", "compose"]
    for f in files or ("compose.yaml",):
        cmd += ["-f", f]
    out = subprocess.run([*cmd, "config"], cwd=ROOT, env=os.environ | env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"docker-compose config failed: {out.stderr.strip()}")
    return yaml.safe_load(out.stdout)["services"]


class LocalTopology:
    """The services of compose.yaml as local processes.

    Args:
        workdir: holds ``config/`` (what compose mounts at /config), ``runs/``, ``redis/`` and ``logs/``.
        env: variables compose interpolates (``PQRL_ENV_TOKEN``, ``PQRL_CONFIG``, ``PQRL_RUN``).
    """

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.services = resolved_services(env)
        self.ports = {name: free_port() for name in _ADDRESSES}
        self.url = {
            name: f"{a.split('://')[0]}://127.0.0.1:{self.ports[name]}" for name, a in _ADDRESSES.items()
        }
        self.logs = workdir / "logs"
        for d in (self.logs, workdir / "runs", workdir / "redis", workdir / "config"):
            d.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def redis_url(self) -> str:
        return self.url["redis"] + "/0"

    def _local(self, value: str) -> str:
        for name, address in _ADDRESSES.items():
            value = value.replace(address, self.url[name])
        value = value.replace("0.0.0.0", "127.0.0.1").replace("/config/", f"{self.workdir}/config/")
        return value.replace("=/runs", f"={self.workdir}/runs")

    def command(self, service: str) -> tuple[list[str], dict[str, str]]:
        """The command line and environment of ``service`` on this machine."""
        svc = self.services[service]
        cmd = [self._local(str(w)) for w in svc["command"]]
        if service == "redis":  # the image's defaults, made explicit here
            return [*cmd, "--port", str(self.ports["redis"]), "--bind", "127.0.0.1", "--dir",
                    str(self.workdir / "redis"), "--save", ""], dict(os.environ)  # fmt: skip
        if "--port" in cmd:
            cmd[cmd.index("--port") + 1] = str(self.ports[service])
        if cmd[0] != "pqrl":
            raise ValueError(f"{service} runs {cmd[0]!r}, not pqrl")
        given = {k: self._local(str(v)) for k, v in (svc.get("environment") or {}).items()}
        return [sys.executable, "-m", "launcher.cli", *cmd[1:]], os.environ | given | {"OMP_NUM_THREADS": "1"}

    def start(self, name: str) -> subprocess.Popen[bytes]:
        """Starts service ``name`` (``rollout-2`` runs the ``rollout`` service)."""
        cmd, env = self.command(name if name in self.services else name.rsplit("-", 1)[0])
        with open(self.logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT
            )
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL, as a crash or an OOM kill would."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def wait_healthy(self, name: str, timeout_s: float = 240) -> None:
        import httpx

        path = {"engine": "/health", "env-server": "/healthz"}[name]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited:\n{self.log(name)[-3000:]}")
            try:
                if httpx.get(self.url[name] + path, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{name} not healthy after {timeout_s} s:\n{self.log(name)[-3000:]}")

    def wait_redis(self, timeout_s: float = 30) -> None:
        import redis

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if redis.Redis.from_url(self.redis_url, socket_connect_timeout=1).ping():
                    return
            except redis.exceptions.ConnectionError:
                time.sleep(0.2)
        raise RuntimeError(f"redis not up after {timeout_s} s:\n{self.log('redis')[-2000:]}")

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        """Stops the clients first, then the services they use; Redis last."""
        rank = ["rollout", "trainer", "env-server", "engine", "redis"]
        for name in sorted(self.procs, key=lambda n: rank.index(n if n in rank else n.rsplit("-", 1)[0])):
            stop_process(self.procs[name])
