"""Each fault and bad input of a new user's field report, run for real: how long until the command
ends, its exit status, and the line it ends with.

    python bench/fail_fast.py | tee bench/results/fail_fast_after.log

Every scenario is a real ``pqrl`` process (a real Redis, a real engine and model, a real env server,
real Docker where the suite needs sandboxes), capped at ``--cap`` seconds: a scenario still running
then is killed and reported as a hang. Prints a table row per scenario, then one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning import short_commit  # noqa: E402
from pqrl.redis_server import free_port  # noqa: E402


@dataclass
class Outcome:
    scenario: str
    seconds: float
    status: int | None  # None: still running at the cap, killed
    last_line: str


def _pqrl(args: list[str], cap: float, env: dict[str, str] | None = None) -> tuple[float, int | None, str]:
    cmd = [sys.executable, "-m", "launcher.cli", *args]
    full_env = os.environ | {"OMP_NUM_THREADS": "1"} | (env or {})
    t0 = time.monotonic()
    pipe = subprocess.PIPE
    kw: dict = {"cwd": ROOT, "env": full_env, "text": True, "start_new_session": True}
    proc = subprocess.Popen(cmd, stdout=pipe, stderr=pipe, **kw)
    try:
        out, err = proc.communicate(timeout=cap)
        status: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        status = None
    took = time.monotonic() - t0
    lines = [ln for ln in (err + out).splitlines() if ln.strip()]
    return took, status, (lines[-1] if lines else "")[:300]


def _job(tmp: Path, name: str, **sections: object) -> Path:
    cfg = {
        "run": name,
        "output_dir": str(tmp / "runs"),
        "tensorboard": False,
        "model": {"name": "smollm2-135m-instruct", "dtype": "float32"},
        "tasks": {"suites": [{"generate": "calc", "n": 8}]},
        "rollout": {"group_size": 2, "max_turns": 2, "max_new_tokens": 16, "max_total_tokens": 512},
        "train": {"steps": 2, "groups_per_step": 1},
        "eval": {"every": 0, "k": 1},
    }
    cfg.update(sections)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@contextlib.contextmanager
def _env_server(token: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher.cli", "env-server", "--port", str(port)],
        cwd=ROOT,
        env=os.environ | {"PQRL_ENV_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        for _ in range(120):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _suite(tmp: Path, env_id: str) -> Path:
    path = tmp / f"suite-{env_id}.jsonl"
    manifest = {"suite": {"name": "s", "version": "1", "env_id": env_id, "kind": "calc"}}
    manifest["suite"]["reward"] = "exact_match"
    task = {"id": "t-0", "kind": "calc", "question": "What is 2 + 3?", "answer": "5"}
    path.write_text(json.dumps(manifest) + "\n" + json.dumps(task) + "\n")
    return path


def scenarios(tmp: Path, cap: float) -> Iterator[Outcome]:
    def run(name: str, args: list[str], env: dict[str, str] | None = None) -> Outcome:
        took, status, line = _pqrl(args, cap, env)
        out = Outcome(name, round(took, 1), status, line)
        print(f"{name:<28} {took:7.1f} s  exit {status!s:>4}  {line}", flush=True)
        return out

    yield run("missing model", ["train", str(_job(tmp, "m", model={"name": str(tmp / "nope")})), "--quiet"])
    with _env_server("right-token") as url:
        wrong = _job(tmp, "tok", services={"env_servers": [url], "env_token": "wrong-token"})
        yield run("wrong env-server token", ["train", str(wrong), "--quiet"])
    docker = _job(tmp, "dock", tasks={"suites": [{"generate": "data", "n": 8}]})
    yield run(
        "Docker unreachable", ["train", str(docker), "--quiet"], {"DOCKER_HOST": "unix:///nonexistent.sock"}
    )
    one_task = {"suites": [{"generate": "calc", "n": 1}]}
    plan = _job(tmp, "plan", tasks=one_task, train={"steps": 4, "groups_per_step": 1})
    yield run("task plan used up", ["train", str(plan), "--quiet"])
    unknown = _job(tmp, "unk", tasks={"suites": [{"path": str(_suite(tmp, "no-such-env-v1"))}]})
    yield run("unknown env in a job", ["train", str(unknown), "--quiet"])
    yield run("validate: unknown env_id", ["tasks", "validate", str(_suite(tmp, "no-such-env-v1"))])
    missing = _job(tmp, "mis", tasks={"suites": [{"path": str(tmp / "missing.jsonl")}]})
    yield run("missing suite file", ["train", str(missing), "--quiet"])
    closed = f"redis://127.0.0.1:{free_port()}"
    yield run("Redis down (status)", ["status", "--run", "r", "--redis-url", closed])
    yield run("Redis down (tasks list)", ["tasks", "list", "--redis-url", closed])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cap", type=float, default=240.0, help="seconds before a scenario counts as a hang")
    args = ap.parse_args()
    print(f"# commit {short_commit(ROOT)}, load {os.getloadavg()[0]:.1f}, cap {args.cap:g} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="pqrl-fail-fast-") as tmp:
        rows = [asdict(o) for o in scenarios(Path(tmp), args.cap)]
    print(json.dumps({"commit": short_commit(ROOT), "cap_s": args.cap, "rows": rows}))


if __name__ == "__main__":
    main()
