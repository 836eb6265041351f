"""The CLI surface and compose.yaml: each service calls a real `pqrl` subcommand; compose accepts the file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher.cli import build_parser, main

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


def test_every_compose_service_runs_a_known_pqrl_subcommand():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    known = _subcommand_paths(build_parser())
    services = compose["services"]
    assert {"redis", "env-server", "engine", "rollout", "trainer"} <= set(services)
    assert "gpu" in services["engine-sglang"]["profiles"]
    for name, svc in services.items():
        if name == "redis":
            continue
        cmd = svc["command"]
        assert cmd[0] == "pqrl", name
        words = tuple(w for w in cmd[1:] if not w.startswith("-"))
        assert any(words[: len(p)] == p for p in known), f"{name} calls unknown subcommand {cmd}"


def test_compose_file_is_valid():
    if shutil.which("docker-compose"):
        cmd = ["docker-compose", "-f", "compose.yaml", "--profile", "gpu", "config", "-q"]
    else:
        cmd = ["docker", "compose", "-f", "compose.yaml", "--profile", "gpu", "config", "-q"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
