"""pqrl's SGLang contract, read from the source of the SGLang release pinned in pyproject.toml.

With ``ast``, because importing these modules needs torch kernels, ZeroMQ, torchvision, ...: the
route table and each handler's request class (``entrypoints/http_server.py``), those classes'
fields (``managers/io_struct.py``), the response keys ``managers/tokenizer_manager.py`` builds and
the finish reasons of ``managers/schedule_batch.py``, against the requests pqrl's client sends and
the fields of pqrl's response models. ``test_sglang_imports`` checks what only importing shows.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Iterable
from pathlib import Path

import pytest
from pydantic import BaseModel

from engine import client as client_module
from engine import pool as pool_module
from engine import weights_client as weights_client_module
from engine.types import (
    ControlResponse,
    FinishReason,
    GenerateResponse,
    LoRAUpdateResponse,
    MetaInfo,
    ModelInfo,
    UpdateWeightsResponse,
)
from tests.engine.sglang_contract import PQRL_ONLY_META, Sent, missing

# what pqrl reads from each control route's answer (the routes whose success the client checks)
ANSWERS: dict[str, type[BaseModel]] = {
    "/update_weights_from_disk": UpdateWeightsResponse,
    "/init_weights_update_group": ControlResponse,
    "/update_weights_from_distributed": ControlResponse,
    "/destroy_weights_update_group": ControlResponse,
    "/model_info": ModelInfo,
}


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


def test_lora_answers_pqrl_reads_are_fields_of_sglangs_lora_update_output(srt, routes, classes):
    # the LoRA routes answer msgspec_to_builtins(result): a LoRAUpdateOutput's fields, not dict literals
    server = (srt / "entrypoints" / "http_server.py").read_text()
    for path in ("/load_lora_adapter", "/unload_lora_adapter"):
        assert routes[path].body in ("LoadLoRAAdapterReqInput", "UnloadLoRAAdapterReqInput")
    assert server.count("msgspec_to_builtins(result)") >= 2
    io = (srt / "managers" / "io_struct.py").read_text()
    assert "LoadLoRAAdapterReqOutput = UnloadLoRAAdapterReqOutput" in io and "= LoRAUpdateOutput" in io
    answer = classes["LoRAUpdateOutput"]
    assert missing(LoRAUpdateResponse.model_fields, set(answer), "LoRAUpdateOutput") == []
    assert len(missing({"message"}, set(answer), "LoRAUpdateOutput")) == 1  # it says error_message
