"""The CLI surface and compose.yaml: each service calls a real `pqrl` subcommand; compose accepts the file."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli import build_parser, main
from launcher.compose_local import resolved_services

ROOT = Path(__file__).resolve().parents[2]


def _subcommand_paths(parser) -> set[tuple[str, ...]]:
    import argparse

    paths = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                inner = _subcommand_paths(sub)
                paths |= {(name, *p) for p in inner} if inner else {(name,)}
    return paths


def test_train_without_a_config_is_a_usage_error_and_explain_lists_fields(capsys, tmp_path):
    assert main(["train"]) == 2
    assert "give a CONFIG" in capsys.readouterr().err
    assert main(["train", "--explain"]) == 0
    assert "train.groups_per_step: int" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: x\ntasks: {suites: [{generate: calc}]}\nrolout: {}\n")
    assert main(["train", str(bad)]) == 2
    assert "rolout" in capsys.readouterr().err


def test_unknown_subcommand_is_a_usage_error():
    with pytest.raises(SystemExit) as err:
        main(["frobnicate"])
    assert err.value.code == 2


def test_console_script_is_installed():
    out = subprocess.run(
        [str(Path(sys.executable).parent / "pqrl"), "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "demo" in out.stdout and "sandbox" in out.stdout


def test_every_compose_service_runs_a_known_pqrl_subcommand_from_one_config():
    known = _subcommand_paths(build_parser())
    services = resolved_services({"PQRL_ENV_TOKEN": "t"})
    assert set(services) == {"redis", "env-server", "engine", "rollout", "trainer"}
    for name, svc in services.items():
        if name == "redis":
            continue
        cmd = svc["command"]
        assert cmd[0] == "pqrl", name
        words = tuple(w for w in cmd[1:] if not w.startswith("-"))
        assert any(words[: len(p)] == p for p in known), f"{name} calls unknown subcommand {cmd}"
    # one job config for every role; where the services are comes from the environment
    assert services["rollout"]["command"][:3] == services["trainer"]["command"][:3] == [
        "pqrl", "train", "/config/quickstart.yaml",
    ]  # fmt: skip
    for name in ("rollout", "trainer"):
        env = services[name]["environment"]
        assert env["PQRL_ENV_TOKEN"] == "t" and env["PQRL_ENGINES"] == "http://engine:30000"
        assert env["PQRL_REDIS_URL"] == "redis://redis:6379/0" and env["PQRL_ENV_SERVERS"]
        assert {d: c["condition"] for d, c in services[name]["depends_on"].items()} == {
            "redis": "service_healthy", "engine": "service_healthy", "env-server": "service_healthy",
        }  # fmt: skip
        # the trainer's published weights are where the engine loads them (the disk weight sync)
        assert (
            "pqrl-runs:/runs:rw" in services[name]["volumes"]
            and "pqrl-runs:/runs:rw" in services["engine"]["volumes"]
        )
    assert services["env-server"]["environment"]["PQRL_ENV_TOKEN"] == "t"
    for name in ("redis", "env-server", "engine"):
        assert services[name]["healthcheck"]["test"], f"{name} has no health check"
    assert all(services[n]["restart"] == "on-failure" for n in services if n != "redis")


def test_the_gpu_override_serves_sglang_to_the_same_address_and_builds_its_extra():
    services = resolved_services({"PQRL_ENV_TOKEN": "t"}, "compose.yaml", "compose.gpu.yaml")
    engine = services["engine"]
    assert engine["command"][:5] == ["pqrl", "engine", "serve", "--backend", "sglang"]
    assert engine["build"]["args"]["EXTRAS"] == "sglang"
    for name in ("engine", "trainer"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
    assert services["rollout"]["environment"]["PQRL_ENGINES"] == "http://engine:30000"
    assert services["rollout"]["build"]["args"]["EXTRAS"] == ""
    assert "EXTRAS" in (ROOT / "Dockerfile").read_text()


def test_the_vllm_override_keeps_vllm_on_loopback_and_its_jobs_beside_it():
    """vLLM's weight routes take no key: it listens on loopback, the jobs share its network namespace
    and name it services.engine vllm (weights from disk, the /runs volume both mount); its command
    passes the real parser and launch_vllm's loopback check; its venv is where the Dockerfile puts it."""
    from engine.config import add_serve_arguments, serve_configs
    from engine.vllm import _loopback
    from launcher.jobconfig import load_config
    from launcher.train_command import _overrides

    known = _subcommand_paths(build_parser())
    services = resolved_services({"PQRL_ENV_TOKEN": "t"}, "compose.yaml", "compose.vllm.yaml")
    assert set(services) == {"redis", "env-server", "engine", "rollout", "trainer"}
    engine = services["engine"]
    assert engine["command"][:5] == ["pqrl", "engine", "serve", "--backend", "vllm"]
    parser = build_parser()
    serve_parser = argparse.ArgumentParser()
    add_serve_arguments(serve_parser)
    _, serve = serve_configs(serve_parser.parse_args(engine["command"][3:]))
    assert serve.backend == "vllm" and _loopback(serve.host) and serve.port == 30000
    assert engine["build"]["args"]["ENGINES"] == "vllm"
    venv = engine["environment"]["PQRL_VLLM_PYTHON"]
    assert venv.removesuffix("/bin/python") in (ROOT / "Dockerfile").read_text()
    assert 'ARG ENGINES=""' in (ROOT / "Dockerfile").read_text()
    for name in ("rollout", "trainer"):
        svc = services[name]
        assert svc["network_mode"] == "service:engine", name
        assert svc["environment"]["PQRL_ENGINES"] == f"http://127.0.0.1:{serve.port}"
        assert svc["environment"]["PQRL_REDIS_URL"] == "redis://redis:6379/0"  # the rest stays by name
        assert "pqrl-runs:/runs:rw" in svc["volumes"] and "pqrl-runs:/runs:rw" in engine["volumes"]
        cmd = svc["command"]
        assert tuple(cmd[1:2]) in known
        args = parser.parse_args(cmd[1:])
        cfg = load_config(Path(args.config.replace("/config", str(ROOT / "examples"))), _overrides(args.set))
        assert cfg.services.engine == "vllm" and cfg.services.weight_sync.method == "disk"
    assert services["rollout"]["build"]["args"].get("ENGINES") is None  # only the engine carries vLLM


def test_compose_refuses_to_start_without_an_env_server_token():
    exe = shutil.which("docker-compose")
    cmd = [exe] if exe else ["docker", "compose"]
    out = subprocess.run([*cmd, "-f", "compose.yaml", "config"], cwd=ROOT, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.returncode != 0 and "PQRL_ENV_TOKEN" in out.stderr
