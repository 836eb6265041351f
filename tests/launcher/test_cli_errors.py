"""Every subcommand's failure is one line on stderr with its class's exit status (pqrl.errors), the
traceback only with --debug; one PQRL_* name per environment variable; --quiet is quiet.

The commands run as separate processes against real files, a closed port and a real Redis."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors_cli import classify, run_command
from pqrl import envvars
from pqrl.errors import JobEnded, PermanentFault, RetriesExhausted, UsageError
from pqrl.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
PQRL = str(Path(sys.executable).parent / "pqrl")
CLOSED = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


def _pqrl(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PQRL_REDIS_URL", "PQRL_DEBUG")}
    return subprocess.run([PQRL, *args], capture_output=True, text=True, timeout=timeout,
                          env=base | (env or {}))  # fmt: skip


def _bad_inputs(tmp: Path) -> list[tuple[list[str], int | set[int], str]]:
    """(command line, exit status, a word of the line) for each subcommand given a bad input."""
    (tmp / "bad.jsonl").write_text('{"suite": 1}\n')
    (tmp / "job.yaml").write_text("run: x\ntasks: {suites: [{generate: calc}]}\n")
    (tmp / "sft.yaml").write_text("model: /no/such/model\ndemonstrations: calc:2\noutput_dir: out\n")
    manifest = {"env_id": "nope-v1", "kind": "calc", "name": "calc", "version": "1", "reward": "exact_match"}
    task = {"id": "t0", "kind": "calc", "question": "1 + 1?", "answer": "2", "expression": "1 + 1"}
    (tmp / "unknown_env.jsonl").write_text(json.dumps({"suite": manifest}) + "\n" + json.dumps(task) + "\n")
    none, bad, out = str(tmp / "none.jsonl"), str(tmp / "bad.jsonl"), str(tmp / "f.jsonl")
    show = ["trajectories", "show", "--run", "r", "--redis-url", CLOSED]
    return [
        (["tasks", "validate", str(tmp / "none.jsonl")], 2, "problem"),
        (["tasks", "validate", str(tmp / "bad.jsonl")], 2, "problem"),
        (["tasks", "submit", none, "--run", "r", "--redis-url", CLOSED], 2, "No such file"),
        (["tasks", "list", "--redis-url", CLOSED], 4, "Redis"),
        (["tasks", "list"], 2, "PQRL_REDIS_URL"),
        (["tasks", "list", "--redis-url", "localhost:6379"], 2, "not a Redis URL"),
        (["tasks", "show", "x", "--redis-url", CLOSED], 4, "Redis"),
        (["tasks", "generate", "calc", "--n", "0", "-o", str(tmp / "x.jsonl")], 2, "positive"),
        (["tasks", "generate", "calc", "--n", "2", "-o", str(tmp / "no" / "x.jsonl")], 2, "does not exist"),
        (["tasks", "filter", none, "-o", out], 2, "No such file"),
        (["tasks", "filter", bad, "-o", out, "--samples", "x"], 2, "--samples"),
        # an unknown environment: refused when an episode opens it (3), or by the suite check (2)
        (["tasks", "filter", str(tmp / "unknown_env.jsonl"), "-o", out, "--quiet",
          "--samples", "1", "--max-new-tokens", "4"], {2, 3}, "nope-v1"),
        (["status", "--run", "r", "--redis-url", CLOSED], 4, "cannot reach Redis"),
        ([*show, "--model", "/no/such/model"], 3, "model"),
        ([*show, "--brief"], 4, "cannot reach Redis"),
        (["rollout", "--run", "r", "--engine", "http://127.0.0.1:9", "--groups-per-step", "x"], 2, "invalid"),
        (["train", str(tmp / "none.yaml")], 2, "no such file"),
        (["train", str(tmp / "job.yaml"), "--set", "train.steps=abc"], 2, "train.steps"),
        (["train", str(tmp / "job.yaml"), "--role", "trainer", "--redis-url", CLOSED], 4, "reach Redis"),
        (["sft", str(tmp / "none.yaml")], 2, "No such file"),
        (["sft", str(tmp / "sft.yaml")], 3, "unknown model"),
        (["model", "prepare", "--name", "/no/such/model"], 3, "unknown model"),
        (["engine", "serve", "--model", "/no/such/model", "--port", str(free_port())], 3, "unknown model"),
        (["sandbox", "build-image", "--dockerfile", str(tmp / "Dockerfile")], 2, "no such file"),
        (["env-server", "--port", "0"], 2, "token"),
        (["demo", "--model", "/no/such/model"], 3, "unknown model"),
        (["frobnicate"], 2, "invalid choice"),
    ]  # fmt: skip


def test_every_subcommand_refuses_a_bad_input_in_one_line_with_its_class_status(tmp_path):
    failed = []
    for argv, status, word in _bad_inputs(tmp_path):
        out = _pqrl(*argv)
        lines = out.stderr.splitlines()
        name = "pqrl " + " ".join(a for a in argv[:2] if not a.startswith(("-", "/")))
        name = "pqrl:" if argv == ["frobnicate"] else name  # no such command: the program's name
        wanted = status if isinstance(status, set) else {status}
        ok = (out.returncode in wanted and len(lines) == 1 and "Traceback" not in out.stderr
              and lines[0].startswith(name) and word in lines[0])  # fmt: skip
        if not ok:
            failed.append(f"{argv}: status {out.returncode} (want {status}), stderr {out.stderr[-600:]!r}")
    assert not failed, "\n".join(failed)
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "f.jsonl").exists()


@pytest.mark.parametrize(
    "argv, status",
    [(["tasks", "list", "--redis-url", CLOSED], 4), (["model", "prepare", "--name", "/no/such/model"], 3)],
)
def test_debug_prints_the_traceback_and_keeps_the_status(argv, status):
    flagged = _pqrl(*argv, "--debug")
    by_env = _pqrl(*argv, env={"PQRL_DEBUG": "1"})
    for out in (flagged, by_env):
        assert out.returncode == status, out.stderr[-2000:]
        assert "Traceback (most recent call last)" in out.stderr
        assert out.stderr.splitlines()[-1].startswith(f"pqrl {argv[0]} {argv[1]}: ")


def test_an_unexpected_exception_is_one_line_naming_its_type_and_the_debug_flag(capsys):
    def boom(args: argparse.Namespace) -> int:
        raise RuntimeError("the disk\nis on fire")

    args = argparse.Namespace(command="status")
    assert run_command(boom, args, debug=False) == 1
    err = capsys.readouterr().err
    assert err == "pqrl status: RuntimeError: the disk; is on fire (run with --debug for the traceback)\n"
    assert run_command(boom, args, debug=True) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1] == "pqrl status: RuntimeError: the disk; is on fire"


def test_classify_follows_the_cause_and_prefers_a_pqrl_error():
    from pqrl.store.connection import StoreUnavailable

    try:
        try:
            raise ConnectionRefusedError(111, "refused")
        except OSError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as e:
        found = classify(e)
    assert isinstance(found, RetriesExhausted) and found.exit_code == 4
    assert isinstance(classify(StoreUnavailable("cannot reach Redis at x")), RetriesExhausted)
    assert isinstance(classify(FileNotFoundError(2, "No such file", "f")), UsageError)
    ended = JobEnded("plan used up")
    assert classify(RuntimeError("x").with_traceback(None)) is None
    try:
        raise ValueError("outer") from ended
    except ValueError as e:
        assert classify(e) is ended
    assert isinstance(classify(ExceptionGroup("g", [PermissionError(13, "denied")])), UsageError)


def test_an_http_error_is_permanent_unless_the_server_says_try_again():
    from engine.errors import EngineHTTPError

    assert isinstance(classify(EngineHTTPError("http://e", 404, "unknown model")), PermanentFault)
    assert isinstance(classify(EngineHTTPError("http://e", 503, "loading")), RetriesExhausted)


def test_the_command_line_classes_every_env_server_error_as_the_rollout_paths_do():
    """One table (pqrl.faults) decides: what a job retries ends a command as exit 4, what a job
    stops on ends it as exit 3, each with the same fix text."""
    from env_server import sessions
    from env_server.client import AuthError, EnvUnavailable
    from pqrl.faults import Fault, fault_of, fix_for

    errors = [
        cls("x")
        for cls in (*vars(sessions).values(), AuthError, EnvUnavailable)
        if isinstance(cls, type) and issubclass(cls, sessions.EnvServerError)
    ]
    assert len(errors) >= 10
    for e in errors:
        found = classify(e)
        want = RetriesExhausted if fault_of(e) is Fault.TRANSIENT else PermanentFault
        assert type(found) is want, (type(e).__name__, found)
        if fix_for(e):
            assert found.fix == fix_for(e), type(e).__name__


def test_the_old_variable_name_works_with_a_warning_and_the_new_one_wins(caplog, monkeypatch):
    monkeypatch.setattr(envvars, "_warned", set())
    with caplog.at_level("WARNING", logger="pqrl.env"):
        assert envvars.setting("PQRL_REDIS_URL", environ={"REDIS_URL": "redis://old"}) == "redis://old"
    assert [r.getMessage() for r in caplog.records] == [
        "pqrl: REDIS_URL is deprecated; set PQRL_REDIS_URL instead"
    ]
    caplog.clear()
    both = {"REDIS_URL": "redis://old", "PQRL_REDIS_URL": "redis://new"}
    monkeypatch.setattr(envvars, "_warned", set())
    with caplog.at_level("WARNING", logger="pqrl.env"):
        assert envvars.setting("PQRL_REDIS_URL", environ=both) == "redis://new"
    assert "REDIS_URL is ignored: PQRL_REDIS_URL is set" in caplog.text
    assert envvars.setting("PQRL_REDIS_URL", environ={"PQRL_REDIS_URL": ""}) is None
    with pytest.raises(KeyError, match="not a pqrl setting"):
        envvars.setting("REDIS_URL")


def test_every_subcommand_reads_the_one_redis_variable(redis_server):
    """``status`` and ``tasks`` read PQRL_REDIS_URL as ``train`` does; REDIS_URL still works, warned."""
    new = _pqrl("tasks", "list", env={"PQRL_REDIS_URL": redis_server.url})
    assert new.returncode == 0 and new.stderr == "", new.stderr
    old = _pqrl("status", "--run", "r", env={"REDIS_URL": redis_server.url})
    assert old.returncode == 1 and "no trainer has reported yet" in old.stdout, old.stderr  # it reached Redis
    assert old.stderr.splitlines() == ["pqrl: REDIS_URL is deprecated; set PQRL_REDIS_URL instead"]
    wins = _pqrl("tasks", "list", env={"PQRL_REDIS_URL": redis_server.url, "REDIS_URL": CLOSED})
    assert wins.returncode == 0, wins.stderr
    missing = _pqrl("tasks", "show", "nope", env={"PQRL_REDIS_URL": redis_server.url})
    assert missing.returncode == 2 and missing.stderr.startswith("pqrl tasks show: "), missing.stderr
    assert len(missing.stderr.splitlines()) == 1


_READ = re.compile(
    r"""(?:os\.environ\.get|os\.getenv|os\.environ\[|setting)\(?\s*["']([A-Z][A-Z0-9_]+)["']"""
)
# set by pqrl for its own processes (docs/cli.md names them), and other tools' variables
_INTERNAL = {"PQRL_LIFETIME", "PQRL_PROBE_FD", "PQRL_FAILPOINT", "PQRL_BENCH_CHECKOUT"}
_OTHERS = {"DOCKER_HOST", "XDG_CACHE_HOME", "WORLD_SIZE", "PYTEST_CURRENT_TEST", "BENCH_MMAP_THRESHOLD",
           "ONEDNN_PRIMITIVE_CACHE_CAPACITY", "PYTHONPATH"}  # fmt: skip


def test_every_variable_read_is_one_pqrl_setting_in_the_docs_table():
    from env_server.app import ServerSettings

    doc = (ROOT / "docs" / "cli.md").read_text()
    table = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", doc, re.M))
    read: dict[str, set[str]] = {}
    for package in ("pqrl", "sandboxes", "loss_masking", "engine", "env_server", "tasks", "trainer",
                    "agent_loop", "launcher", "bench"):  # fmt: skip
        for path in (ROOT / package).rglob("*.py"):
            for name in _READ.findall(path.read_text()):
                read.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert {"PQRL_REDIS_URL", "PQRL_ENV_TOKEN", "PQRL_CACHE"} <= set(read), "the scan finds the reads"
    settings = set(read) - _INTERNAL - _OTHERS
    assert settings <= set(envvars.SETTINGS), (
        f"read outside pqrl.envvars.SETTINGS: {settings - set(envvars.SETTINGS)}"
    )
    server = {f"PQRL_ENV_{f.upper()}" for f in ServerSettings.model_fields}
    assert set(envvars.SETTINGS) | server == table, "docs/cli.md's table and the settings differ"
    assert all(n.startswith("PQRL_") for n in table)
    for name in _INTERNAL:
        assert f"`{name}`" in doc, f"{name} is read ({read[name]}) but docs/cli.md does not name it"
    for old in envvars.OLD_NAMES:
        assert old not in read, (
            f"{old} is read directly in {read.get(old)}: read its new name through setting()"
        )


def test_a_server_on_a_taken_port_says_so_in_one_line_before_loading_anything():
    """The port is bound first: the engine refuses before its model loads (no log line of uvicorn's)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for argv in (["engine", "serve", "--model", "smollm2-135m-instruct", "--port", port],
                     ["env-server", "--insecure-local", "--port", port]):  # fmt: skip
            out = _pqrl(*argv, timeout=60)
            lines = out.stderr.splitlines()
            assert out.returncode == 2 and len(lines) == 1, (argv, out.stderr[-600:])
            assert lines[0].startswith(f"pqrl {argv[0]}"), lines[0]
            assert f"port {port} on 127.0.0.1 is in use" in lines[0]
    wrapped = _pqrl("env-server", "--insecure-local", "--port", "70000", timeout=60)  # not served on 4464
    assert wrapped.returncode == 2 and "--port 70000 is not a port" in wrapped.stderr, wrapped.stderr


def test_a_port_bound_for_a_slow_start_cannot_be_bound_again():
    """Bound but not listening, a port can be bound again by another SO_REUSEADDR socket (Linux):
    the first server would then fail after its minutes of loading."""
    from pqrl.errors import UsageError
    from pqrl.serving import listening_socket

    first = listening_socket("127.0.0.1", 0)
    try:
        with pytest.raises(UsageError, match="is in use"):
            listening_socket("127.0.0.1", first.getsockname()[1])
    finally:
        first.close()
