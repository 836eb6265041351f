"""pqrl's SGLang contract, checked by importing the code of the SGLang release pinned in
pyproject.toml.

In a subprocess with a few missing third-party modules stubbed (the ones these modules import at the
top but the probed code does not use): ``ServerArgs``'s argument parser (assembled at import time
from dozens of field modules, so reading it with ast would mean reimplementing it) against the
command line ``pqrl engine serve --backend sglang`` would exec, the ``SamplingParams`` constructor
and its ``verify``, the JSON contract gate that every ``/generate`` body passes
(``entrypoints/api_contract.py``) and the generated response types next to it.
``test_sglang_source`` reads the rest from the source with ast.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import io
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import engine.sglang
from engine.config import add_serve_arguments
from engine.serve_command import serve
from engine.types import FinishReason, GenerateResponse, MetaInfo, SamplingParams
from tests.engine.sglang_contract import PQRL_ONLY_META, ROOT, Sent, missing

# -- the import route: a subprocess with SGLang on sys.path --------------------------------------

# Imported at the top of the probed modules, absent here, unused by the probed code. Only names in
# this list are stubbed, and only where they cannot be imported: anything else missing still fails.
STUBBED = ("orjson", "pybase64", "triton", "zmq", "IPython", "aiohttp")
VOCAB = 49152
API_FINISH_TYPES = ("FinishStop", "FinishLength", "FinishAbort")  # the FinishReason union of api_types


class _Anything:
    """Stands for any attribute of a stubbed module: callable, subclassable, usable as a decorator."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Anything()

    def __getattr__(self, name: str) -> Any:
        return _Anything()

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(
        self, name: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def probe_main() -> None:
    """Runs in the subprocess: ``argv`` is SGLang's folder, the question file, the answer file."""
    home, question, out = sys.argv[1:4]
    sys.path.insert(0, home)
    sys.meta_path.insert(0, _StubFinder({n for n in STUBBED if importlib.util.find_spec(n) is None}))
    Path(out).write_text(json.dumps(probe(json.loads(Path(question).read_text()))))


def probe(question: dict[str, Any]) -> dict[str, Any]:
    from msgspec.structs import fields
    from sglang.api.v1 import api_types
    from sglang.srt.entrypoints.api_contract import generate_contract_error
    from sglang.srt.sampling.sampling_params import SamplingParams as SGLangSamplingParams

    accepted = set(inspect.signature(SGLangSamplingParams).parameters)
    return {
        "cli": [parse_sglang_args(argv) for argv in question["argvs"]],
        "unknown_params": [sorted(set(p) - accepted) for p in question["sampling_params"]],
        "verify": [verify_sampling(SGLangSamplingParams, p) for p in question["sampling_params"]],
        "contract": [generate_contract_error(body) for body in question["generate_bodies"]],
        "api_fields": {n: [f.name for f in fields(getattr(api_types, n))] for n in question["api_types"]},
    }


def parse_sglang_args(argv: list[str]) -> dict[str, Any]:
    """SGLang's own parser on ``argv``, as ``prepare_server_args`` builds it: the values, or its error."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            values = vars(parser.parse_args(argv))
    except SystemExit:
        return {"error": err.getvalue().strip().splitlines()[-1]}
    return {"values": {k: v for k, v in values.items() if isinstance(v, str | int | float | bool | None)}}


def verify_sampling(cls: Any, params: dict[str, Any]) -> str | None:
    """None when SGLang's SamplingParams takes ``params`` and its ``verify`` passes, else why not."""
    try:
        cls(**params).verify(VOCAB)
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


# -- pqrl engine serve --backend sglang -----------------------------------------------------------


class _Exec(Exception):
    def __init__(self, argv: list[str]) -> None:
        self.argv = argv


SERVE_ARGV = ["--backend", "sglang", "--model", "/models/m", "--host", "0.0.0.0", "--port", "30001"]
SERVE_ARGV += ["--weight-version", "0", "--seed", "3", "--api-key", "k"]
SERVE_ARGV += ["--sglang-arg=--tp-size=2"]  # the example of --sglang-arg's help text
# what those flags must become in SGLang's parser
SGLANG_VALUES = {"model_path": "/models/m", "host": "0.0.0.0", "port": 30001, "weight_version": "0"}
SGLANG_VALUES |= {"random_seed": 3, "api_key": "k", "tp_size": 2}


def sglang_launch_argv(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The command line ``pqrl engine serve`` would exec, captured at ``os.execv``."""
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    find_spec = importlib.util.find_spec

    def execv(path: str, argv: list[str]) -> None:
        raise _Exec(argv)

    monkeypatch.delenv("PQRL_ENGINE_API_KEY", raising=False)
    monkeypatch.setattr(engine.sglang.os, "execv", execv)
    monkeypatch.setattr(
        engine.sglang.importlib.util, "find_spec", lambda n, *a: n == "sglang" or find_spec(n, *a)
    )
    monkeypatch.setattr("pqrl.model_cache.prepare_model", lambda model: Path(model))
    with pytest.raises(_Exec) as launched:
        serve(parser.parse_args(SERVE_ARGV))
    return launched.value.argv


def pqrl_generate_bodies(sent: list[Sent]) -> list[dict[str, Any]]:
    bodies = [s.body for s in sent if s.path == "/generate"]
    every = {f.name for f in dataclasses.fields(SamplingParams)}
    assert set(bodies[-1]["sampling_params"]) == every, "EVERY_SAMPLING_FIELD must set every field"
    return bodies


@pytest.fixture(scope="module")
def probed(home: Path, sent: list[Sent], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One subprocess answers every import-route question, pqrl's inputs and broken ones alike."""
    with pytest.MonkeyPatch.context() as mp:
        argv = sglang_launch_argv(mp)
    assert argv[1:3] == ["-m", "sglang.launch_server"] and (home / "sglang" / "launch_server.py").is_file()
    bodies = pqrl_generate_bodies(sent)
    params = [b["sampling_params"] for b in bodies]
    question = {
        "argvs": [argv[3:], [*argv[3:], "--no-such-sglang-flag"]],
        "sampling_params": [*params, {**params[-1], "no_such_param": 1}],
        "generate_bodies": [*bodies, {**bodies[-1], "sampling_params": {"no_such_param": 1}}],
        "api_types": [*API_FINISH_TYPES, "GenerateResponse", "GenerateMetaInfo", "LogprobEntry"],
    }
    tmp = tmp_path_factory.mktemp("sglang-probe")
    (tmp / "question.json").write_text(json.dumps(question))
    code = "from tests.engine.test_sglang_imports import probe_main; probe_main()"
    cmd = [sys.executable, "-c", code, str(home), str(tmp / "question.json"), str(tmp / "answer.json")]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (
        f"importing SGLang's modules failed (stub another import?):\n{out.stderr[-3000:]}"
    )
    return json.loads((tmp / "answer.json").read_text())


def test_sglang_parser_accepts_the_launch_command_line(probed):
    pqrl_cli, broken = probed["cli"]
    assert "error" not in pqrl_cli, pqrl_cli
    assert {k: pqrl_cli["values"].get(k) for k in SGLANG_VALUES} == SGLANG_VALUES
    assert "unrecognized arguments: --no-such-sglang-flag" in broken["error"]


def test_sglang_sampling_params_take_every_param_pqrl_sends(probed):
    *pqrl_params, broken = probed["unknown_params"]
    assert pqrl_params == [[]] * len(pqrl_params)
    assert broken == ["no_such_param"]
    *pqrl_verdicts, broken_verdict = probed["verify"]
    assert pqrl_verdicts == [None] * len(pqrl_verdicts)
    assert broken_verdict and "no_such_param" in broken_verdict


def test_sglang_contract_gate_admits_every_generate_body(probed):
    *pqrl_bodies, broken = probed["contract"]
    assert pqrl_bodies == [None] * len(pqrl_bodies)
    assert broken and "unknown field `no_such_param`" in broken


def test_sglang_api_types_carry_the_response_fields_pqrl_reads(probed):
    # The generated JSON contract of SGLang's servers, next to the Python source checked above.
    api = {name: set(names) for name, names in probed["api_fields"].items()}
    problems = missing(GenerateResponse.model_fields, api["GenerateResponse"], "api_types.GenerateResponse")
    problems += missing(
        set(MetaInfo.model_fields) - PQRL_ONLY_META, api["GenerateMetaInfo"], "GenerateMetaInfo"
    )
    finish = set().union(*(api[name] for name in API_FINISH_TYPES)) | {"type"}  # type: the union's tag
    problems += missing(FinishReason.model_fields, finish, "api_types' finish reasons")
    assert problems == []
    # pqrl takes a logprob row's first element as the logprob
    assert probed["api_fields"]["LogprobEntry"][0] == "logprob"
