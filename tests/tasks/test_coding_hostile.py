"""Hostile data the grading container hands back, end to end in real containers: each is the
submission's 0 with a reason, never a grader failure (which would make the episode
``failed_infra``, dropped from training instead of scored). The pure cases and the fuzzing are in
tests/tasks/test_coding_record.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from sandboxes.docker import DockerSandbox
from sandboxes.docker_api import DockerAPI
from sandboxes.hardening import SandboxSettings
from tasks.coding.diffs import unified_diff
from tasks.coding.grader import CodingGrader
from tests.tasks.conftest import leftovers
from tests.tasks.test_coding_hacks import SOURCE, TASK, play, run, write

RUN = "pytest-coding-hostile"

# from_roman returns a set holding a frozenset: no forgery at all, only a value whose decoding
# once gave a tuple holding a (mutable, unhashable) set.
FROZEN = "\n\ndef from_roman(text):\n    return {(0, frozenset())}\n"  # after the original: replaces it


def forger(hostile: str) -> str:
    """roman.py code that replaces the first check's values the recorder emits with ``hostile`` (a Python
    expression), or, for ``raw:...``, writes that line into the probe pipe itself."""
    if hostile.startswith("raw:"):
        return (
            "import os\n\n"
            "_fd = int(os.environ.get('PQRL_PROBE_FD', '-1'))\n"
            f"if _fd >= 0:\n    os.write(_fd, {hostile[4:]} + b'\\n')\n\n\n"
        )
    return (
        "try:\n    import pqrl_probe_runtime as _rt\nexcept ImportError:\n    _rt = None\n\n\n"
        "_once = []\n\n\ndef _forge(site, values):\n"
        "    if not _once:  # the first check only: the record stays small\n"
        f"        _once.append(1)\n        values = [{hostile} for _ in values]\n"
        "    _real_emit(site, values)\n\n\n"
        "if _rt is not None:\n    _real_emit = _rt._emit\n    _rt._emit = _forge\n\n\n"
    )


BAD_VALUE, MALFORMED = "a value the recorder cannot write", "the probe record is malformed"
HOSTILE = {  # name: (the forged value or raw line, what the first test's failure says)
    "huge_int_numeral": ("{'int': '9' * 5000}", BAD_VALUE),
    "bad_bytes": ("{'bytes': 'zz'}", BAD_VALUE),
    "complex_of_strings": ("{'complex': ['a', []]}", BAD_VALUE),
    "set_in_a_set": ("{'set': ['{\"set\": []}']}", "failed"),  # decodes: a set holding an Opaque
    "line_nested_100000_deep": ("raw:b'[' * 100000", MALFORMED),
    "raw_5000_digit_int": ('raw:b\'{"t": "x", "s": 0, "v": [\' + b\'9\' * 5000 + b\']}\'', MALFORMED),
}


@pytest.fixture
async def grader() -> AsyncIterator[CodingGrader]:
    api = DockerAPI()

    async def make() -> DockerSandbox:
        return await DockerSandbox.create(api, SandboxSettings(memory_mb=512), run=RUN)

    yield CodingGrader(make, source_policy=False, test_timeout=30)  # the forgers import what they like
    left = await leftovers(api, RUN)
    await api.close()
    assert left == []


@pytest.mark.parametrize(("hostile", "why"), list(HOSTILE.values()), ids=list(HOSTILE))
async def test_a_hostile_record_scores_zero_with_a_reason(grader, hostile, why):
    result = await grader.grade_patch(TASK, unified_diff("roman.py", SOURCE, forger(hostile) + SOURCE))
    assert result.reward == 0.0
    failures = result.info["held_out_failures"]
    assert why in " ".join(failures.values()), failures
    json.dumps(result.info, ensure_ascii=False).encode("utf-8")


async def test_a_source_nested_past_the_parsers_limits_does_not_parse(grader):
    deep = SOURCE + "\n\nLIMIT = a" + ".b" * 100_000 + "\n"
    grader.source_policy = True
    result = await grader.grade_patch(TASK, unified_diff("roman.py", SOURCE, deep))
    assert result.reward == 0.0 and result.info["reason"] == "a source file does not parse"
    assert not result.info["tampered"]


async def test_a_frozenset_in_a_set_is_judged_in_a_real_episode(manager):
    """The function under test returns ``{(0, frozenset())}``: judged (0, the tests fail), not a
    grader failure."""
    result, _ = await play(manager, [write("roman.py", SOURCE + FROZEN)])
    assert result.reward == 0.0
    assert "tests did not pass" in result.info["reason"], result.info["reason"]
    assert result.info["held_out_failures"]


async def test_a_source_file_linked_to_a_non_utf8_path_is_judged(manager):
    result, _ = await play(manager, [run("ln -sf \"/tmp/$(printf 'x\\377')\" roman.py")])
    assert result.reward == 0.0
    assert "link out of the workspace" in result.info["reason"]
    assert "\\xff" in result.info["reason"], result.info["reason"]
    result.model_dump_json()  # the reply that carries it serialises
