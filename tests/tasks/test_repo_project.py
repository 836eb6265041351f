"""What the generator reads of a local project (tasks/repo/project.py) and keeps of its runs
(tasks/repo/generate.py's outcome cache), without containers."""

from __future__ import annotations

from pathlib import Path

from sandboxes.recipes import normal_name
from tasks.coding.junit import TestOutcome
from tasks.repo.generate import _Cache
from tasks.repo.project import Project, load_project


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_environments_and_build_output_in_a_checkout_are_not_the_project(tmp_path):
    src = _write(
        tmp_path / "src",
        {
            "calc/__init__.py": "",
            "calc/ops.py": "def add(a, b):\n    return a + b\n",
            "tests/test_ops.py": "from calc.ops import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
            ".venv/lib/python3.11/site-packages/six/test_six.py": "def test_x():\n    pass\n",
            ".venv/lib/python3.11/site-packages/six/six.py": "X = 1\n",
            "build/lib/calc/ops.py": "def add(a, b):\n    return a + b\n",
            "build/lib/tests/test_ops.py": "def test_y():\n    pass\n",
            "py311/pyvenv.cfg": "home = /usr/bin\n",  # a virtual environment under any name
            "py311/lib/site/test_other.py": "def test_z():\n    pass\n",
            "calc.egg-info/test_meta.py": "def test_m():\n    pass\n",
        },
    )
    project = load_project(src, "calc", "calc", tmp_path / "staged")
    assert project.tests == ["tests/test_ops.py"]
    assert sorted(project.sources) == ["calc/__init__.py", "calc/ops.py"]
    assert project.tests_reaching("calc/ops.py") == ["tests/test_ops.py"]


def test_a_test_files_import_closure_is_walked_once(monkeypatch):
    walked: list[str] = []
    real = Project._walk

    def counting(self: Project, path: str) -> set[str]:
        walked.append(path)
        return real(self, path)

    monkeypatch.setattr(Project, "_walk", counting)
    project = Project(
        name="p",
        origin="p",
        root=Path("."),
        sources={"p/a.py": "", "p/b.py": ""},
        tests=["tests/test_a.py", "tests/test_b.py"],
        modules={"p": "p/__init__.py", "p.a": "p/a.py", "p.b": "p/b.py"},
        imports={"tests/test_a.py": {"p.a"}, "tests/test_b.py": {"p.b"}, "p/a.py": {"p.b"}},
    )
    assert project.tests_reaching("p/a.py") == ["tests/test_a.py"]
    assert project.tests_reaching("p/b.py") == ["tests/test_a.py", "tests/test_b.py"]
    assert sorted(walked) == ["tests/test_a.py", "tests/test_b.py"]


def test_a_timed_out_run_is_known_only_up_to_its_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("PQRL_CACHE", str(tmp_path))
    cache = _Cache("k")
    cache.put("slow", None, timed_out_at=30.0)
    cache.put("broke", None)
    cache.put("ran", {"t::a": TestOutcome("t::a", "passed", "", "")})
    again = _Cache("k")  # as a later run reads it from disk
    for c in (cache, again):
        assert c.get("slow", 30.0) == (True, None)  # the same limit: it would time out again
        assert c.get("slow", 60.0) == (False, None)  # a longer limit: not known, run it
        assert c.get("broke", 60.0) == (True, None)
        hit, got = c.get("ran", 60.0)
        assert hit and got is not None and got["t::a"].outcome == "passed"


def test_one_name_normalisation_for_index_and_installed_names():
    assert normal_name("More_Itertools") == normal_name("more.itertools") == "more-itertools"
    assert normal_name("a__b--c") == "a-b-c"


def test_requirements_are_what_the_metadata_declares_then_what_the_code_imports(tmp_path):
    from tasks.repo.project import infer_requirements

    files = {
        "pkgx/__init__.py": "from .tbl import table\n",
        # with no metadata, the package's own top-level imports count (a test may import only pkgx.tbl)
        "pkgx/tbl.py": "import json\nfrom tabulate import tabulate\nimport yaml\nimport _pkgx_speedups\n"
        "from google.protobuf import message\nimport google\n\n\ndef table(r):\n    return tabulate(r)\n",
        "pkgx/opt.py": "try:\n    import numpy\nexcept ImportError:\n    numpy = None\n",  # optional
        "tests/test_tbl.py": "import pytest\nimport serial\nfrom pkgx.tbl import table\n\n\ndef test_t():\n"
        "    assert table([[1]])\n",
    }
    project = load_project(_write(tmp_path / "a", files), "pkgx", "pkgx", tmp_path / "ta")
    assert infer_requirements(project) == ["protobuf", "pyserial", "pyyaml", "tabulate"]
    assert infer_requirements(project, infer=False) == []
    declared = '[project]\nname = "pkgx"\ndependencies = ["tabulate>=0.9", "pytest>=7", "packaging>=24"]\n'
    project = load_project(
        _write(tmp_path / "b", {**files, "pyproject.toml": declared}), "pkgx", "pkgx", tmp_path / "tb"
    )
    # declared: the package's imports are not guessed (they may be optional); the tests' still are
    assert infer_requirements(project) == ["tabulate>=0.9", "packaging>=24", "pyserial"]


def test_an_sdists_requires_dist_counts_without_the_extras(tmp_path):
    from tasks.repo.project import declared_requirements

    info = (
        "Metadata-Version: 2.1\nName: x\nRequires-Dist: attrs>=22\n"
        'Requires-Dist: sphinx; extra == "docs"\nRequires-Dist: six ; python_version < "3.12"\n'
        "Requires-Dist: pkg @ https://example.org/pkg.tar.gz#sha256=abc\n\nRequires-Dist: not a header\n"
    )
    _write(tmp_path, {"PKG-INFO": info})
    assert declared_requirements(tmp_path) == [
        "attrs>=22",
        'six ; python_version < "3.12"',
        "pkg @ https://example.org/pkg.tar.gz#sha256=abc",
    ]
    cfg = "[options]\ninstall_requires =\n    click>=8\n    # a comment\n    rich  # pretty\n"
    _write(tmp_path / "c", {"setup.cfg": cfg})
    assert declared_requirements(tmp_path / "c") == ["click>=8", "rich"]
    from_file = "[options]\ninstall_requires = file: requirements.txt\n"
    _write(tmp_path / "d", {"setup.cfg": from_file, "requirements.txt": "-r other.txt\nidna\n# x\nsix>=1\n"})
    assert declared_requirements(tmp_path / "d") == ["idna", "six>=1"]
    assert declared_requirements(tmp_path / "e") is None  # nothing declares them
    _write(tmp_path / "f", {"pyproject.toml": '[project]\nname = "f"\ndependencies = []\n'})
    assert declared_requirements(tmp_path / "f") == []


def test_a_function_whose_bug_is_not_kept_or_is_dropped_gets_its_next_mutant(tmp_path):
    from tasks.repo.generate import Options, _Draws

    src = "def shout(word):\n    return word.upper() + '!' * 2\n"
    project = load_project(
        _write(tmp_path / "p", {"w.py": src, "test_w.py": "from w import shout\n"}), "w", "w", tmp_path / "t"
    )
    draws = _Draws(project, None, None, "", Options(workers=2, per_function=1))  # type: ignore[arg-type]
    from tasks.repo.generate import _candidates

    drawn = _candidates(project, 0)
    assert len(drawn) >= 3 and {m.function for _, m in drawn} == {"shout"}
    draws.queue = [(i, p, m) for i, (p, m) in enumerate(drawn)]
    first = draws._batch()
    assert [m for _, _, m, _ in first] == [drawn[0][1]]  # one per function at a time, the rest wait
    draws._requeue()  # not kept: the next one is drawn
    second = draws._batch()
    assert [m for _, _, m, _ in second] == [drawn[1][1]]
    draws.per_function["w.py:shout"] = 1  # kept
    draws._requeue()
    assert draws._batch() == []  # the function has its bug
    kept = type("K", (), {"path": "w.py", "mutation": drawn[1][1]})()
    draws.release(kept)  # its task failed the check: the function's next mutant, in draw order
    assert [m for _, _, m, _ in draws._batch()] == [drawn[2][1]]
