"""pqrl's SGLang contract, checked against the code of the SGLang release pinned in pyproject.toml.

SGLang needs a GPU stack, so ``scripts/setup.sh`` installs only its own files (``--no-deps``, plus
msgspec) under ``$PQRL_CACHE/sglang-<pin>``. This test reads them two ways:

- with ``ast``, because importing these modules needs torch kernels, ZeroMQ, torchvision, ...: the
  route table and each handler's request class (``entrypoints/http_server.py``), those classes'
  fields (``managers/io_struct.py``), the response keys ``managers/tokenizer_manager.py`` builds and
  the finish reasons of ``managers/schedule_batch.py``;
- by importing, in a subprocess with a few missing third-party modules stubbed (the ones these modules
  import at the top but the probed code does not use): ``ServerArgs``'s argument parser (assembled at
  import time from dozens of field modules, so reading it with ast would mean reimplementing it), the
  ``SamplingParams`` constructor and its ``verify``, the JSON contract gate that every ``/generate``
  body passes (``entrypoints/api_contract.py``) and the generated response types next to it.

pqrl's side comes from pqrl's code: the requests are what ``EngineClient`` sends to a recording
transport, the response fields are pqrl's response models, the command line is what
``pqrl engine serve --backend sglang`` would exec. Every kind of check also runs on a broken input and
must fail there, so a checker that cannot fail is caught.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import dataclasses
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import io
import json
import re
import subprocess
import sys
import tomllib
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

import engine.sglang
from engine import client as client_module
from engine import pool as pool_module
from engine import weights_client as weights_client_module
from engine.client import EngineClient
from engine.config import add_serve_arguments
from engine.serve_command import serve
from engine.types import (
    ControlResponse,
    FinishReason,
    GenerateResponse,
    MetaInfo,
    ModelInfo,
    PauseRequest,
    SamplingParams,
    UpdateWeightsResponse,
)
from pqrl.cache import cache_dir

ROOT = Path(__file__).resolve().parents[2]
URL = "http://sglang.test"
# meta_info fields only the built-in engine reports; pqrl must not need them from SGLang
PQRL_ONLY_META = {"output_token_weight_versions"}
# what pqrl reads from each control route's answer (the routes whose success the client checks)
ANSWERS: dict[str, type[BaseModel]] = {
    "/update_weights_from_disk": UpdateWeightsResponse,
    "/init_weights_update_group": ControlResponse,
    "/update_weights_from_distributed": ControlResponse,
    "/destroy_weights_update_group": ControlResponse,
    "/model_info": ModelInfo,
}


# -- the installed SGLang ------------------------------------------------------------------------


def pinned_version() -> str:
    """The release of pyproject.toml's ``sglang`` extra (scripts/setup.sh reads the same pin)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (pin,) = [r for r in project["optional-dependencies"]["sglang"] if r.startswith("sglang==")]
    return pin.removeprefix("sglang==")


@pytest.fixture(scope="module")
def home() -> Path:
    """The folder holding the pinned SGLang's ``sglang`` package; fails (not skips) without it."""
    version = pinned_version()
    home = cache_dir() / f"sglang-{version}"
    if not (home / ".pqrl-complete").is_file():
        pytest.fail(
            f"SGLang {version} is not installed in {home}: run `bash scripts/setup.sh`", pytrace=False
        )
    metadata = (home / f"sglang-{version}.dist-info" / "METADATA").read_text()
    assert f"\nVersion: {version}\n" in metadata, f"{home} holds another SGLang release than {version}"
    return home


@pytest.fixture(scope="module")
def srt(home: Path) -> Path:
    return home / "sglang" / "srt"


# -- reading SGLang's source with ast -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Field:
    required: bool
    choices: frozenset[str] | None  # the values of a Literal[...] annotation


@dataclasses.dataclass(frozen=True)
class Route:
    methods: frozenset[str]
    body: str | None  # the request class FastAPI parses the JSON body into
    answer_keys: frozenset[str]  # string keys of the dicts the handler builds


@functools.cache
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def text(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def literal_keys(node: ast.Dict) -> set[str]:
    return {k for k in map(text, node.keys) if k is not None}


def class_fields(module: ast.Module) -> dict[str, dict[str, Field]]:
    """Each class's fields, those of its bases in the module included: annotated class attributes are
    the fields of both a ``@dataclass`` and a ``msgspec.Struct``."""
    classes = {n.name: n for n in module.body if isinstance(n, ast.ClassDef)}

    def fields(name: str) -> dict[str, Field]:
        out: dict[str, Field] = {}
        for base in classes[name].bases:
            if isinstance(base, ast.Name) and base.id in classes:
                out |= fields(base.id)
        for stmt in classes[name].body:
            if _is_field(stmt):
                out[stmt.target.id] = Field(_required(stmt), _choices(stmt.annotation))
        return out

    return {name: fields(name) for name in classes}


def _is_field(stmt: ast.stmt) -> bool:
    is_annotated_name = isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    return is_annotated_name and "ClassVar" not in ast.unparse(stmt.annotation)


def _required(stmt: ast.AnnAssign) -> bool:
    value = stmt.value
    if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field"):
        return not any(k.arg in ("default", "default_factory") for k in value.keywords)
    return value is None


def _choices(annotation: ast.expr) -> frozenset[str] | None:
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value).endswith("Literal"):
        elts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        return frozenset(v for v in map(text, elts) if v is not None)
    return None


VERBS = {"get": "GET", "post": "POST", "put": "PUT", "delete": "DELETE", "patch": "PATCH", "head": "HEAD"}


def route_table(module: ast.Module, request_classes: Iterable[str]) -> dict[str, Route]:
    """Every ``@app.<verb>(path)`` / ``@app.api_route(path, methods=...)`` handler with a literal path."""
    known = set(request_classes)
    table: dict[str, Route] = {}
    for fn in ast.walk(module):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for path, methods in filter(None, map(_route, fn.decorator_list)):
                old = table.get(path)
                methods |= old.methods if old else frozenset()
                keys = {k for d in ast.walk(fn) if isinstance(d, ast.Dict) for k in literal_keys(d)}
                table[path] = Route(methods, _body_class(fn, known), frozenset(keys))
    return table


def _route(decorator: ast.expr) -> tuple[str, frozenset[str]] | None:
    if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)):
        return None
    path = text(decorator.args[0]) if decorator.args else None
    if ast.unparse(decorator.func.value) != "app" or path is None:
        return None
    verb = decorator.func.attr
    if verb == "api_route":
        listed = next((k.value for k in decorator.keywords if k.arg == "methods"), None)
        return path, frozenset(map(text, listed.elts)) if isinstance(listed, ast.List) else frozenset({"GET"})
    return (path, frozenset({VERBS[verb]})) if verb in VERBS else None


def _body_class(fn: ast.FunctionDef | ast.AsyncFunctionDef, known: set[str]) -> str | None:
    """The request class among the handler's parameter annotations (``X`` or ``Annotated[X, Body()]``)."""
    for arg in fn.args.args:
        names = [n.id for n in ast.walk(arg.annotation) if isinstance(n, ast.Name)] if arg.annotation else []
        found = [n for n in names if n in known]
        if found:
            return found[0]
    return None


def keys_written_to(module: ast.Module, var: str) -> set[str]:
    """Keys written into dicts named ``var``: ``var = {...}``, ``var[k] = ...``, ``var.update({...})``."""
    keys: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            if any(ast.unparse(t) == var for t in node.targets):
                keys |= literal_keys(node.value)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and ast.unparse(node.value) == var
        ):
            keys |= {k for k in [text(node.slice)] if k}
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == f"{var}.update" and node.args:
            keys |= literal_keys(node.args[0]) if isinstance(node.args[0], ast.Dict) else set()
    return keys


def dicts_with_key(module: ast.Module, key: str) -> set[str]:
    """All keys of the dict literals that have ``key`` (the shapes of the objects holding it)."""
    dicts = [d for d in ast.walk(module) if isinstance(d, ast.Dict) and key in literal_keys(d)]
    return set().union(*map(literal_keys, dicts))


def finish_reasons(module: ast.Module) -> tuple[set[str], set[str]]:
    """The keys and the ``type`` values of the dicts the ``FINISH*`` classes' ``to_json`` return."""
    keys: set[str] = set()
    kinds: set[str] = set()
    for cls in module.body:
        if isinstance(cls, ast.ClassDef) and cls.name.startswith("FINISH"):
            for d in (d for d in ast.walk(cls) if isinstance(d, ast.Dict)):
                keys |= literal_keys(d)
                kinds |= {
                    v
                    for k, v in zip(map(text, d.keys), map(text, d.values), strict=True)
                    if k == "type" and v
                }
    return keys, kinds


@pytest.fixture(scope="module")
def classes(srt: Path) -> dict[str, dict[str, Field]]:
    return class_fields(parse(srt / "managers" / "io_struct.py"))


@pytest.fixture(scope="module")
def routes(srt: Path, classes: dict[str, dict[str, Field]]) -> dict[str, Route]:
    return route_table(parse(srt / "entrypoints" / "http_server.py"), classes)


# -- what pqrl sends: EngineClient against a recording transport ---------------------------------


@dataclasses.dataclass(frozen=True)
class Sent:
    method: str
    path: str
    body: Any  # the parsed JSON body, None without one


def answer(request: httpx.Request) -> httpx.Response:
    """A minimal SGLang-shaped answer; only the requests matter here."""
    path = request.url.path
    if path == "/generate":
        body = json.loads(request.content)
        n = body["sampling_params"]["max_new_tokens"]
        meta = {"finish_reason": {"type": "length", "length": n}, "weight_version": "7"}
        meta["output_token_logprobs"] = [[-0.5, 5, None]] * n
        return httpx.Response(200, json={"text": "", "output_ids": [5] * n, "meta_info": meta})
    if path == "/model_info":
        return httpx.Response(200, json={"weight_version": "7"})
    if path in ("/health", "/abort_request"):
        return httpx.Response(200)
    if path == "/flush_cache":
        return httpx.Response(200, text="Cache flushed.\n")
    return httpx.Response(200, json={"success": True, "message": "ok"})


EVERY_SAMPLING_FIELD = SamplingParams(
    temperature=0.7,
    top_p=0.9,
    top_k=50,
    max_new_tokens=3,
    stop=("</tool>",),
    stop_token_ids=(2,),
    ignore_eos=True,
    skip_special_tokens=False,
    no_stop_trim=True,
    sampling_seed=11,
)


async def drive(client: EngineClient) -> None:
    """Every call pqrl makes on an SGLang server, through pqrl's own client."""
    await client.health()
    for params in (None, SamplingParams(temperature=0, max_new_tokens=2), EVERY_SAMPLING_FIELD):
        await client.generate([1, 2, 3], params, rid="r1")
    await client.abort("r1")
    for mode in typing.get_args(PauseRequest.model_fields["mode"].annotation):
        await client.pause_generation(mode)
    await client.continue_generation()
    await client.flush_cache()
    await client.update_weights_from_disk("/ckpt/v3", 3)
    await client.init_weights_update_group("10.0.0.1", 29500, backend="nccl")
    await client.update_weights_from_distributed(
        ["w"], ["torch.bfloat16"], [[2, 2]], "weight_update_group", 3
    )
    await client.destroy_weights_update_group()
    assert await client.get_weight_version() == {URL: 7}


@pytest.fixture(scope="module")
def sent() -> list[Sent]:
    recorded: list[Sent] = []

    def record(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        recorded.append(Sent(request.method, request.url.path, body))
        return answer(request)

    async def run() -> None:
        async with EngineClient(URL, transport=httpx.MockTransport(record)) as client:
            await drive(client)

    asyncio.run(run())
    return recorded


def pqrl_routes() -> set[str]:
    """Every route path written in the client's modules (so a new call cannot escape ``drive``)."""
    found: set[str] = set()
    for module in (client_module, pool_module, weights_client_module):
        tree = parse(Path(module.__file__))
        found |= {s for s in map(text, ast.walk(tree)) if s and re.fullmatch(r"/[a-z_]+", s)}
    return found


# -- the checks: problems found, as text ---------------------------------------------------------


def route_problems(sent: Iterable[Sent], routes: dict[str, Route]) -> list[str]:
    problems = []
    for s in sent:
        route = routes.get(s.path)
        if route is None:
            problems.append(f"{s.method} {s.path}: SGLang has no such route")
        elif s.method not in route.methods:
            problems.append(f"{s.method} {s.path}: SGLang serves it for {sorted(route.methods)} only")
    return problems


def body_problems(
    sent: Iterable[Sent], routes: dict[str, Route], classes: dict[str, dict[str, Field]]
) -> list[str]:
    """Unknown fields (SGLang ignores them: its request parsing drops extra keys), missing required
    fields and values outside a Literal."""
    problems = []
    for s in (s for s in sent if s.path in routes):
        cls = routes[s.path].body
        body = s.body or {}
        if cls is None:
            problems += [f"{s.path}: SGLang reads no body, pqrl sends {sorted(body)}"] if body else []
            continue
        fields = classes[cls]
        problems += [f"{s.path}: {k!r} is not a field of {cls}" for k in body if k not in fields]
        problems += [
            f"{s.path}: {cls} requires {k!r}" for k, f in fields.items() if f.required and k not in body
        ]
        problems += [
            f"{s.path}: {k}={v!r} is not one of {sorted(fields[k].choices)} ({cls})"
            for k, v in body.items()
            if k in fields and fields[k].choices is not None and v not in fields[k].choices
        ]
    return problems


def missing(wanted: Iterable[str], produced: set[str], where: str) -> list[str]:
    return [f"{where} does not produce {k!r}" for k in sorted(set(wanted) - produced)]


def finish_types_pqrl_checks() -> set[str]:
    """The finish types the client compares with (``finish.type == "..."``)."""
    tree = parse(Path(client_module.__file__))
    compares = (
        n for n in ast.walk(tree) if isinstance(n, ast.Compare) and ast.unparse(n.left).endswith(".type")
    )
    return {s for c in compares for s in map(text, c.comparators) if s}


def test_every_request_targets_a_route_of_sglang(sent, routes):
    assert {s.path for s in sent} >= pqrl_routes(), "a route pqrl calls is not exercised by drive()"
    assert route_problems(sent, routes) == []
    broken = [Sent("POST", "/no_such_route", {}), Sent("GET", "/update_weights_from_disk", None)]
    assert len(route_problems(broken, routes)) == 2


def test_every_body_field_is_a_field_of_sglangs_request_class(sent, routes, classes):
    assert routes["/generate"].body == "GenerateReqInput"  # the parser found the handlers' classes
    assert body_problems(sent, routes, classes) == []
    broken = [
        Sent("POST", "/update_weights_from_disk", {"model_path": "/m", "no_such_field": 1}),
        Sent(
            "POST", "/init_weights_update_group", {"master_address": "h", "master_port": 1, "world_size": 2}
        ),
        Sent("POST", "/pause_generation", {"mode": "no_such_mode"}),
    ]
    assert len(body_problems(broken, routes, classes)) == 3


def test_response_fields_pqrl_reads_are_built_by_sglang(srt, routes):
    # Source search with ast: where SGLang's tokenizer manager assembles /generate answers.
    manager = parse(srt / "managers" / "tokenizer_manager.py")
    meta_read = set(MetaInfo.model_fields) - PQRL_ONLY_META
    assert all(not MetaInfo.model_fields[k].is_required() for k in PQRL_ONLY_META)
    finish_keys, finish_kinds = finish_reasons(parse(srt / "managers" / "schedule_batch.py"))
    problems = missing(GenerateResponse.model_fields, dicts_with_key(manager, "meta_info"), "generate answer")
    problems += missing(meta_read, keys_written_to(manager, "meta_info"), "meta_info")
    problems += missing(FinishReason.model_fields, finish_keys, "finish_reason")
    problems += missing(finish_types_pqrl_checks(), finish_kinds, "finish_reason type")
    for path, model in ANSWERS.items():
        problems += missing(model.model_fields, set(routes[path].answer_keys), path)
    assert problems == []
    assert len(missing({"no_such_meta_key"}, keys_written_to(manager, "meta_info"), "meta_info")) == 1


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
    code = "from tests.engine.test_sglang_contract import probe_main; probe_main()"
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
