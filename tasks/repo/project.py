"""A real Python project for task generation: its files, its package modules, its test files and
which test files reach which module.

The source is a PyPI sdist (``NAME==VERSION``, downloaded once into pqrl's cache with ``pip
download --no-binary``) or a local directory or git repository (its HEAD). The staged tree holds
the files only: no history, no compiled bytecode (a ``.pyc`` of the clean module would be the fix).
Test files are pytest's defaults (``test_*.py``, ``*_test.py``); every other ``.py`` file outside
tests, docs, examples and build scripts is package source, mutated when it parses.
A test file reaches a module when the module is in the transitive closure of its imports (static:
``import a.b`` runs ``a/__init__`` too; relative imports resolved), the cheap stand-in for coverage.
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import hashlib
import json
import re
import shutil
import sys
import tempfile
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pqrl.cache import cache_dir
from pqrl.errors import PermanentFault, UsageError
from sandboxes.recipes import normal_name
from sandboxes.repo_source import ARCHIVE_SUFFIXES, stage_repository

__all__ = ["Project", "declared_requirements", "fetch_sdist", "infer_requirements", "load_project"]

PYPI_SIMPLE = "https://pypi.org/simple"
_MAX_DOWNLOAD = 256 << 20  # an sdist larger than this is not a project to mutate here
_SPEC = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")
_NOT_SOURCE = {"tests", "test", "testing", "docs", "doc", "examples", "example", "benchmarks", "bench",
               "scripts", "tools", "build", "dist", ".tox", ".nox", "venv", ".venv"}  # fmt: skip
# Not the project's own files at all (neither tests nor source): environments and build output a
# local checkout may hold. A folder with a pyvenv.cfg is a virtual environment whatever its name.
_NOT_PROJECT = {".venv", "venv", "build", "dist", ".tox", ".nox", ".eggs", "site-packages",
                "dist-packages", "node_modules", "__pypackages__", ".git", ".hg", ".mypy_cache",
                ".pytest_cache"}  # fmt: skip
_NOT_SOURCE_FILES = {"setup.py", "conftest.py", "noxfile.py", "tasks.py", "fabfile.py", "conf.py"}
# import names whose distribution is named otherwise; the base image already has pytest
_DISTRIBUTIONS = {"yaml": "pyyaml", "dateutil": "python-dateutil", "PIL": "pillow", "attr": "attrs",
                  "bs4": "beautifulsoup4", "sklearn": "scikit-learn", "skimage": "scikit-image",
                  "serial": "pyserial", "jwt": "pyjwt", "cv2": "opencv-python-headless",
                  "Crypto": "pycryptodome", "OpenSSL": "pyopenssl", "dotenv": "python-dotenv",
                  "git": "gitpython", "docx": "python-docx", "zmq": "pyzmq", "magic": "python-magic",
                  "google.protobuf": "protobuf", "google": "", "jose": "python-jose",
                  "multipart": "python-multipart", "Levenshtein": "levenshtein"}  # fmt: skip
# ("google": a namespace many distributions share: not guessed)
_IN_IMAGE = {"pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging"}


@dataclass
class Project:
    """A staged clean tree and what the generator needs to know about it."""

    name: str  # the distribution name (for an sdist) or the directory's name
    origin: str  # NAME==VERSION or the path it came from
    root: Path
    sources: dict[str, str]  # package module path -> text (it parses)
    tests: list[str]  # test file paths
    modules: dict[str, str] = field(default_factory=dict)  # dotted module name -> path (all .py files)
    imports: dict[str, set[str]] = field(default_factory=dict)  # path -> dotted names it imports
    required: dict[str, set[str]] = field(default_factory=dict)  # path -> its top-level imports

    closures: dict[str, set[str]] = field(default_factory=dict)  # test path -> its import closure

    def tests_reaching(self, path: str) -> list[str]:
        """The test files whose import closure holds the module at ``path``."""
        target = next((m for m, p in self.modules.items() if p == path), None)
        return [t for t in self.tests if target is not None and target in self._closure(t)]

    def _closure(self, path: str) -> set[str]:
        """Computed once per test file: every source file asks about every test file."""
        if path not in self.closures:
            self.closures[path] = self._walk(path)
        return self.closures[path]

    def _walk(self, path: str) -> set[str]:
        seen: set[str] = set()
        todo = list(self.imports.get(path, ()))
        while todo:
            name = todo.pop()
            for prefix in _prefixes(name):  # importing a.b.c runs a/__init__ and a/b/__init__ first
                if prefix in self.modules and prefix not in seen:
                    seen.add(prefix)
                    todo += self.imports.get(self.modules[prefix], ())
        return seen


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def fetch_sdist(spec: str, *, index: str = PYPI_SIMPLE) -> Path:
    """The sdist of ``NAME==VERSION`` from pqrl's cache, downloaded there the first time.

    The file comes straight from the index's simple API (PEP 691 JSON), its sha256 checked: no
    pip, because ``pip download`` of an sdist builds its metadata, which runs the project's
    ``setup.py`` or build backend on the host. The host only ever reads the archive.
    """
    m = _SPEC.match(spec.strip())
    if m is None:
        raise UsageError(f"--from-sdist {spec!r} is not NAME==VERSION", fix="e.g. --from-sdist toolz==0.12.1")
    folder = cache_dir("sdists", re.sub(r"[^a-z0-9.]+", "-", spec.lower()))
    found = [p for p in folder.iterdir() if p.name.endswith(ARCHIVE_SUFFIXES)]
    if found:
        return found[0]
    name, version = normal_name(m.group(1)), m.group(2)
    listing = _get(f"{index.rstrip('/')}/{name}/", accept="application/vnd.pypi.simple.v1+json", spec=spec)
    try:
        files = json.loads(listing)["files"]
    except (ValueError, KeyError, TypeError):
        raise PermanentFault(f"{spec}: the index's answer for {name} is not its JSON file list") from None
    sdists = [f for f in files if _is_sdist_of(str(f.get("filename", "")), name, version)]
    if not sdists:
        raise UsageError(
            f"{spec}: the index has no sdist of version {version}", fix="pick a version that ships one"
        )
    chosen = sdists[0]
    data = _get(str(chosen["url"]), accept="*/*", spec=spec)
    want = (chosen.get("hashes") or {}).get("sha256")
    if want and hashlib.sha256(data).hexdigest() != want:
        raise PermanentFault(f"{spec}: {chosen['filename']} does not match the index's sha256")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        got = Path(tmp, Path(str(chosen["filename"])).name)
        got.write_bytes(data)
        return got.rename(folder / got.name)  # the same file system: atomic, whole or absent


def _is_sdist_of(filename: str, name: str, version: str) -> bool:
    stem = next((filename[: -len(s)] for s in ARCHIVE_SUFFIXES if filename.endswith(s)), None)
    if stem is None or "-" not in stem:
        return False
    dist, _, ver = stem.rpartition("-")
    return normal_name(dist) == name and ver == version


def _get(url: str, *, accept: str, spec: str) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "pqrl"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            data = bytes(reply.read(_MAX_DOWNLOAD + 1))
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise UsageError(f"{spec}: the index has no such project ({url}: 404)") from None
        raise PermanentFault(f"{spec}: {url} answered HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise PermanentFault(
            f"{spec}: cannot reach {url}: {e}", fix="check the network to the package index"
        ) from None
    if len(data) > _MAX_DOWNLOAD:
        raise UsageError(f"{spec}: {url} is larger than {_MAX_DOWNLOAD >> 20} MiB")
    return data


def load_project(source: str | Path, name: str, origin: str, dest: Path) -> Project:
    """Stages ``source`` (an archive, a directory, a git repository's HEAD) into ``dest`` (new)."""
    path = Path(source)
    if not path.exists():
        raise UsageError(f"{source} does not exist")
    commit = "HEAD" if (path / ".git").exists() else None
    stage_repository(path, commit, dest, name)
    shutil.rmtree(dest / ".git")
    for junk in [*dest.rglob("__pycache__"), *dest.rglob("*.py[co]")]:  # compiled clean code
        shutil.rmtree(junk, ignore_errors=True) if junk.is_dir() else junk.unlink(missing_ok=True)
    project = Project(name=name, origin=origin, root=dest, sources={}, tests=[])
    src = "src/" if (dest / "src").is_dir() and not (dest / "src" / "__init__.py").exists() else ""
    for file in sorted(dest.rglob("*.py")):
        rel = file.relative_to(dest).as_posix()
        if file.is_symlink() or not file.is_file() or _outside_project(dest, rel):
            continue
        try:
            text = file.read_text()
            tree = ast.parse(text)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        dotted = _module_name(rel.removeprefix(src) if rel.startswith(src) else rel)
        project.modules[dotted] = rel
        project.imports[rel] = _imports(tree, dotted, rel.endswith("__init__.py"))
        parts = rel.split("/")
        # unconditional imports only: one under try, in a function or a class may be optional
        plain = ast.Module(
            body=[n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)], type_ignores=[]
        )
        if parts[-1].startswith("test_") or parts[-1].endswith("_test.py"):
            project.tests.append(rel)
            project.required[rel] = _imports(plain, dotted, False)
        elif not (set(parts[:-1]) & _NOT_SOURCE) and parts[-1] not in _NOT_SOURCE_FILES:
            project.sources[rel] = text
            project.required[rel] = _imports(plain, dotted, rel.endswith("__init__.py"))
    if not project.tests:
        raise UsageError(f"{origin} ships no test files (test_*.py or *_test.py)")
    return project


def _outside_project(root: Path, rel: str) -> bool:
    """Whether ``rel`` lies in an environment or build output (``_NOT_PROJECT``, an ``.egg-info``,
    a folder holding ``pyvenv.cfg``) rather than in the project."""
    parts = rel.split("/")[:-1]
    for i, part in enumerate(parts):
        if part in _NOT_PROJECT or part.endswith(".egg-info"):
            return True
        if (root.joinpath(*parts[: i + 1]) / "pyvenv.cfg").is_file():
            return True
    return False


def _module_name(rel: str) -> str:
    name = rel.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def _imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join([*parts, *([node.module] if node.module else [])])
            if base:
                out.add(base)
                out |= {f"{base}.{a.name}" for a in node.names if a.name != "*"}
    return out


def infer_requirements(project: Project, *, infer: bool = True) -> list[str]:
    """What the tests need installed: the project's declared runtime dependencies (``pyproject.toml``
    ``[project] dependencies``, ``setup.cfg`` ``install_requires``, an sdist's ``Requires-Dist``
    without an extra), then (``infer``) the distributions its test files import at their top level
    (not under ``try``, not in a function), and its package modules too when no metadata declares
    its dependencies, that are neither the standard library, the project's own modules, private
    (``_speedups``), declared already, nor in the base image (``hypothesis`` for ``import
    hypothesis``). An import name whose distribution is named otherwise (``yaml``: ``pyyaml``) is
    mapped when known; ``--requirements`` adds what is missed, ``--no-infer`` drops the guesses."""
    declared = declared_requirements(project.root)
    if not infer:
        return declared or []
    have = {normal_name(m.group(0)) for r in declared or () if (m := _REQ_NAME.match(r))}
    own = {m.split(".")[0] for m in project.modules}
    found: set[str] = set()
    for path, names in project.required.items():
        if declared is not None and path not in project.tests:
            continue  # the metadata says what the package needs; its imports may be optional extras
        for name in names:
            top = name.split(".")[0]
            if (
                not top
                or top.startswith("_")
                or top in own
                or top in sys.stdlib_module_names
                or top in _IN_IMAGE
            ):
                continue
            dist = _DISTRIBUTIONS.get(".".join(name.split(".")[:2]), _DISTRIBUTIONS.get(top, top))
            if dist and normal_name(dist) not in have:
                found.add(dist)
    return [*(declared or []), *sorted(found)]


_REQ_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_RUNNER = {"pytest", "pluggy", "iniconfig", "py"}  # the base image's test runner: never replaced


def declared_requirements(root: Path) -> list[str] | None:
    """The runtime dependencies ``root``'s metadata declares, as pip specs, in file order, without
    the ones only an extra asks for and without the test runner the base image has; None when no
    metadata declares them (a bare folder, a ``setup.py`` that computes them)."""
    specs: list[str] | None = None
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        with contextlib.suppress(tomllib.TOMLDecodeError, UnicodeDecodeError, AttributeError):
            project = tomllib.loads(pyproject.read_text()).get("project", {})
            if "dependencies" in project:
                specs = [d for d in project["dependencies"] if isinstance(d, str)]
    cfg = root / "setup.cfg"
    if specs is None and cfg.is_file():
        parser = configparser.ConfigParser(interpolation=None)
        with contextlib.suppress(configparser.Error, UnicodeDecodeError):
            parser.read_string(cfg.read_text())
            if parser.has_option("options", "install_requires"):
                specs = _lines(root, parser.get("options", "install_requires"))
    info = root / "PKG-INFO"
    if specs is None and info.is_file():
        with contextlib.suppress(UnicodeDecodeError):
            lines = info.read_text().split("\n\n", 1)[0].splitlines()  # the headers, not the description
            specs = [
                ln.split(":", 1)[1]
                for ln in lines
                if ln.startswith("Requires-Dist:") and "extra ==" not in ln
            ]
    if specs is None:
        return None
    out = []
    for spec in (re.split(r"\s#", s, maxsplit=1)[0].strip() for s in specs):  # `name @ url#sha` stays whole
        name = _REQ_NAME.match(spec)
        if name and normal_name(name.group(0)) not in _RUNNER and spec not in out:
            out.append(spec)
    return out


def _lines(root: Path, value: str) -> list[str]:
    """setup.cfg's requirement lines; ``file: a.txt, b.txt`` reads those files (pip's format: no
    options, no ``-r`` includes)."""
    value = value.strip()
    if not value.startswith("file:"):
        return value.splitlines()
    out = []
    for name in value.removeprefix("file:").split(","):
        path = root / name.strip()
        if path.is_file() and path.resolve().is_relative_to(root.resolve()):
            out += [ln for ln in path.read_text().splitlines() if not ln.strip().startswith(("-", "#"))]
    return out


def tree_digest(files: dict[str, str]) -> str:
    """A short hash of a set of files' paths and texts."""
    h = hashlib.sha256()
    for path, text in sorted(files.items()):
        h.update(f"{path}\0{text}\0".encode())
    return h.hexdigest()[:16]
