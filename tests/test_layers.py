"""The import rules of the layers, checked on every import in the code, the ones inside functions too.

From the bottom: the floor (``pqrl``) imports no other package of the project; ``sandboxes``,
``loss_masking`` and ``engine`` stand on the floor alone; ``env_server`` adds the sandboxes;
``tasks`` adds the environments; ``trainer`` sees records, token logic and the engine client, never
an environment, a sandbox or the rollout code; ``agent_loop`` runs episodes with all of those but
the trainer, and sees of the engine only its interface (``engine.protocol``); ``launcher`` wires
everything. No package imports one of its own layer or above, and no
two modules import each other, directly or around a longer circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> the project packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "pqrl": set(),
    "sandboxes": {"pqrl"},
    "loss_masking": {"pqrl"},
    "engine": {"pqrl"},
    "env_server": {"pqrl", "sandboxes"},
    "tasks": {"pqrl", "sandboxes", "env_server"},
    "trainer": {"pqrl", "loss_masking", "engine"},
    "agent_loop": {"pqrl", "loss_masking", "engine", "sandboxes", "env_server", "tasks"},
    "launcher": {
        "pqrl",
        "loss_masking",
        "engine",
        "sandboxes",
        "env_server",
        "tasks",
        "trainer",
        "agent_loop",
    },
}
# nothing in a sandbox knows what a model is
MODEL_LIBRARIES = {"torch", "transformers", "accelerate", "gguf"}
# package -> the only modules of a package below it that it may import: the engine's interface and
# the data types it speaks in, never the client, the server or the batcher behind it
ONLY_THROUGH: dict[str, dict[str, set[str]]] = {"agent_loop": {"engine": {"engine.protocol"}}}


def _modules() -> dict[str, Path]:
    out = {}
    for package in ALLOWED:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "repos" in path.relative_to(ROOT / package).parts:  # task fixtures: code the agent edits
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement and ``import_module("...")`` call."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package_parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package_parts[: len(package_parts) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            found += [
                (node.lineno, f"{target}.{a.name}") for a in node.names if f"{target}.{a.name}" in MODULES
            ]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def violations_of(module: str, path: Path) -> list[str]:
    out = []
    package = module.split(".")[0]
    for line, target in imports_of(path, module):
        top = target.split(".")[0]
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line} imports {target}"
        if top in ALLOWED and top != package and top not in ALLOWED[package]:
            out.append(f"{where} ({package} may import {sorted(ALLOWED[package]) or 'no project package'})")
        only = ONLY_THROUGH.get(package, {}).get(top)
        if only is not None and target not in only:
            out.append(f"{where} ({package} may import of {top} only {sorted(only)})")
        if package == "sandboxes" and top in MODEL_LIBRARIES:
            out.append(f"{where} (sandboxes know nothing of models)")
    return out


def test_no_import_runs_against_the_layers():
    assert [v for module, path in MODULES.items() for v in violations_of(module, path)] == []


@pytest.mark.parametrize(
    "source",
    [
        "from engine.client import EngineClient\n",
        "from engine.types import Generation\n",
        "from engine import protocol\n",
        "def f():\n    import engine.batcher\n",
    ],
)
def test_the_agent_loop_sees_the_engine_only_through_its_interface(tmp_path, source):
    path = tmp_path / "probe.py"
    path.write_text("from engine.protocol import Engine, Generation, SamplingParams\n")
    assert violations_of("agent_loop.probe", path) == []
    path.write_text(source)
    assert violations_of("agent_loop.probe", path) != []
    assert violations_of("trainer.probe", path) == [], "the rule is the agent loop's alone"


def test_no_circle_of_imports_between_modules():
    graph = {m: {t for _, t in imports_of(p, m) if t in MODULES and t != m} for m, p in MODULES.items()}
    # a package's __init__ importing its own modules is the usual re-export, not a circle
    for m in graph:
        graph[m] = {t for t in graph[m] if not t.startswith(m + ".")}
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                circles.append(trail[trail.index(t) :] + [t] if t in trail else [m, t])
            elif t not in state:
                visit(t, trail + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert circles == []


@pytest.mark.parametrize(
    ("source", "rule"),
    [
        ("import agent_loop.agent\n", "trainer may import"),
        ("def f():\n    from env_server.client import HttpEnvClient\n", "trainer may import"),
        ("import importlib\nimportlib.import_module('sandboxes.docker')\n", "trainer may import"),
    ],
)
def test_the_checker_sees_lazy_and_dynamic_imports(tmp_path, source, rule):
    """The rule would catch a trainer module importing the rollout side, inside a function or by name."""
    path = tmp_path / "probe.py"
    path.write_text(source)
    found = imports_of(path, "trainer.probe")
    tops = {t.split(".")[0] for _, t in found}
    assert tops & {"agent_loop", "env_server", "sandboxes"} and not tops <= ALLOWED["trainer"], rule
