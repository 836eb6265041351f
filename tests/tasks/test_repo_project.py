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
