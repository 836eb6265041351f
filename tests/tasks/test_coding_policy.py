"""The source policy against ways to reach builtins through objects and run-time attribute names,
and every built-in task's gold patch, applied by git, against the policy."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tasks.coding.diffs import split_patch
from tasks.coding.generate import SUITE_PATH
from tasks.coding.policy import check_source
from tasks.suite import load_suite

DUNDER_GLOBALS = "'_' * 2 + 'globals' + '_' * 2"
BYPASSES = {
    # functools.wraps / update_wrapper copy attributes named at run time (module globals -> sys)
    "wraps_runtime_dunder": (
        "import functools\n\n\ndef _h():\n    pass\n\n\n"
        f"functools.wraps(len, assigned=({DUNDER_GLOBALS},))(_h)\n"
    ),
    "wraps_from_import": "from functools import wraps\n",
    "update_wrapper": (
        "import functools\n\n\ndef _h():\n    pass\n\n\n"
        f"functools.update_wrapper(_h, len, ({DUNDER_GLOBALS},), ())\n"
    ),
    # a builtin taken as an attribute of a module object reached at run time
    "attribute_call_getattr": "def f(m, x):\n    return m.getattr(x, 'y')\n",
    "attribute_call_eval": "def f(holder):\n    return holder._b.eval('1')\n",
    "attribute_open": "def f(m):\n    return m.open('/tmp/report.xml', 'w')\n",
    "attribute_setattr": "def f(m, o):\n    m.setattr(o, 'x', 1)\n",
    "attribute_exec": "def f(m):\n    return m.exec('import os')\n",
    # the builtins module under an alias
    "alias_builtins_module": "def f(holder):\n    b = holder.builtins\n    return b.len\n",
    "private_alias_builtins_module": "def f(h):\n    b = h._builtins\n    return b\n",
    "name_builtins": "def f(builtins):\n    return builtins\n",
    # getattr looked up by name in a namespace: vars(builtins), __builtins__, a dict reached at run time
    "vars_of_builtins": "def f(m):\n    return vars(m)['get' + 'attr']\n",
    "dunder_builtins": "g = __builtins__['getattr']\n",
    "namespace_subscript": "def f(ns):\n    return ns['getattr'](1, 'real')\n",
    "namespace_get": "def f(ns):\n    return ns.get('eval')\n",
    "class_pattern_attribute": "def f(m):\n    match m:\n        case object(getattr=g):\n"
    "            return g\n",
}
STILL_ALLOWED = [
    "import re\nP = re.compile('a+')\n",
    "import functools\n\n\n@functools.lru_cache(maxsize=None)\ndef f(n):\n    return n\n",
    "from functools import partial, reduce\n\nadd = partial(reduce, lambda a, b: a + b)\n",
    "def f(d):\n    return d['open'], d['exit'], d.getter\n",
]


@pytest.mark.parametrize("source", BYPASSES.values(), ids=BYPASSES.keys())
def test_every_bypass_form_is_flagged(source):
    violations = check_source("m.py", source.encode(), b"")
    assert {v.rule for v in violations} & {"builtin", "import", "introspection"}, violations


@pytest.mark.parametrize("source", STILL_ALLOWED)
def test_plain_code_near_the_bypasses_still_passes(source):
    assert check_source("m.py", source.encode(), b"") == []


def test_every_gold_patch_passes_the_policy(tmp_path: Path):
    """Each of the built-in tasks' gold patches, applied to its buggy repository by git, leaves
    sources that the policy accepts: the tightened rules refuse no correct solution here."""
    tasks = load_suite(SUITE_PATH).tasks
    assert len(tasks) >= 66
    for task in tasks:
        root = tmp_path / task.id
        for path, content in task.repo.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(content)
        (root / "gold.diff").write_text(task.gold_patch or "")
        subprocess.run(["git", "apply", "gold.diff"], cwd=root, check=True, capture_output=True)
        for part in split_patch(task.gold_patch or ""):
            patched = (root / part.new_path).read_bytes()
            assert patched != task.repo[part.new_path].encode()
            original = task.repo[part.new_path].encode()
            assert check_source(part.new_path, patched, original) == [], task.id
