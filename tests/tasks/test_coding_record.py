"""Judging is total over what the grading container writes: any probe record, however malformed or
hostile, gets a verdict (never an exception, which would make the episode ``failed_infra``), and
the recorder never runs the code under test's own methods while it encodes a value. The same
record kinds in real containers: tests/tasks/test_coding_hostile.py."""

from __future__ import annotations

import base64
import json
import math
import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.coding import probe_runtime, probes, record
from tasks.coding.policy import check_source
from tasks.coding.verdict import Reference, judge
from tests.tasks.test_coding_grading import CANARY, TASK, _all, _report
from tests.tasks.test_coding_probes import GOLD, judged, rewritten

DEEP = "[" * 100_000 + "]" * 100_000
HOSTILE_VALUES = [
    {"int": "9" * 5000},
    {"int": "0x" + "f" * 30_000},
    {"int": []},
    {"bytes": "zz"},
    {"bytes": 5},
    {"complex": ["a", []]},
    {"complex": [1]},
    {"complex": [{"int": "9" * 400}, 0]},  # too large for a float
    {"float": "nan?"},
    {"float": ["1"]},
    {"set": [DEEP]},
    {"set": [json.dumps({"set": []})]},  # a set inside a set: unhashable
    {"set": [5]},
    {"frozenset": ["[1,"]},
    {"dict": [[1, 2]]},
    {"dict": [['{"list": [[]]}', 1]]},  # an unhashable key
    {"dict": [["1"]]},
    {"list": {"a": 1}},
    {"str": 5},
    [1, 2],
    10**4000,
    {"tuple": [{"list": [{"int": "1" * 4300}]}]},
]


def with_value(site: int, value: object) -> dict:
    """GOLD with site ``site``'s recorded operands all replaced by ``value``."""
    out = []
    for s, values in GOLD["t"]:
        if s == site:
            values = [value if not (isinstance(v, dict) and "!truth" in v) else v for v in values]
        out.append((s, values))
    return {"t": out}


def test_hostile_values_fail_their_check_with_a_reason():
    for value in HOSTILE_VALUES:
        for site in (0, 3, 5, 7):
            problems = judged(with_value(site, value))
            assert set(problems) == {"t"}, (site, value)
            assert "tests/test_m.py:" in problems["t"]


def test_hostile_lines_make_the_record_malformed():
    lines = [
        DEEP.encode(),
        b'{"t": "t", "s": 0, "v": [' + b"[" * 70 + b"]" * 70 + b"]}",  # past the depth bound
        b'{"t": "t", "s": 0, "v": [' + b"9" * 5000 + b"]}",
        b'{"t": "t", "s": true, "v": []}',
        b'{"t": ["t"], "s": 0, "v": []}',
        b'{"t": "t", "s": 0, "v": [1]',  # truncated
        b"\xff\xfe\x00",
        b"[]",
    ]
    for line in lines:
        try:
            probes.parse_record(line)
        except probes.BadRecord:
            continue
        raise AssertionError(f"accepted {line[:40]!r}")


def test_a_frozenset_in_a_set_decodes_hashable():
    """The finding: ``{(0, frozenset())}`` decoded to a tuple holding a set, and hashing it raised."""
    value = {(0, frozenset()), frozenset({frozenset({1})})}
    decoded = probes.decode(json.loads(json.dumps(probe_runtime.encode(value))))
    assert decoded == value and isinstance(next(iter(decoded - {(0, frozenset())})), frozenset)
    assert judged(with_value(0, probe_runtime.encode({(0, frozenset())}))) == {
        "t": "the check at tests/test_m.py:6 failed"
    }


def test_big_ints_round_trip_in_hex_and_only_when_bounded():
    for n in (2**53, -(2**53), 10**5000, -(10**5000)):
        assert probes.decode(json.loads(json.dumps(probe_runtime.encode(n)))) == n
    cut = probe_runtime.encode(1 << 100_000)
    assert "len" in cut and isinstance(probes.decode(cut), probes.Opaque)


def test_the_recorder_runs_none_of_the_values_own_methods():
    ran = []

    class Meta(type):
        @property
        def __name__(cls):
            ran.append("metaclass __name__")
            return "M"

    class Sneaky(int, metaclass=Meta):
        @property
        def __class__(self):
            ran.append("__class__")
            return int

        def __int__(self):
            ran.append("__int__")
            return 0

        __index__ = __int__

        def __eq__(self, other):
            ran.append("__eq__")
            return True

        def __hash__(self):
            ran.append("__hash__")
            return 0

        def __repr__(self):
            ran.append("__repr__")
            return "0"

    class Text(str):
        def __str__(self):
            ran.append("__str__")
            return ""

        def __getitem__(self, i):
            ran.append("__getitem__")
            return ""

    s, t = Sneaky(7), Text("abc")
    encoded = probe_runtime.encode([s, t, (s,), {"k": s}])
    assert ran == []
    items = encoded["list"]
    assert items[0]["base"] == 7 and items[0]["obj"].endswith("Sneaky")
    assert items[1]["base"] == "abc"
    assert probe_runtime._mro(Sneaky)[0].endswith(".<locals>.Sneaky") and ran == []


def test_the_recorder_bounds_what_it_encodes():
    wide: list = [list(range(1000)) for _ in range(1000)]
    encoded = probe_runtime.encode([wide, wide])
    text = json.dumps(encoded)
    assert '"cut": true' in text and len(text) < 2_000_000
    long_strings = json.dumps(probe_runtime.encode([["x" * 10_000] * 1000] * 1000))
    assert '"cut": true' in long_strings and len(long_strings) < 3_000_000
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert "deep" in json.dumps(probe_runtime.encode(deep))


def test_strings_from_the_sandbox_become_sendable_and_bounded():
    name = b"/tmp/\xff\xfe".decode("utf-8", "surrogateescape")
    info = record.sendable({"reason": f"is a link to {name}", name: ["x" * 10**6]})
    blob = json.dumps(info, ensure_ascii=False).encode("utf-8")  # raises on a lone surrogate
    assert b"\\udcff" in blob and len(blob) < 10_000


# ---------------------------------------------------------------- fuzzing the host's entry point

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["\ud800", "9" * 5000, "0x" + "f" * 20, DEEP[:3000]]),
)
_TAGS = ["int", "float", "list", "tuple", "set", "frozenset", "dict", "bytes", "complex", "str", "obj",
         "class", "state", "base", "tzinfo", "!raised", "!truth", "msg", "len", "deep", "cut"]  # fmt: skip
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(_TAGS), inner, max_size=3),
        st.lists(inner, max_size=3).map(lambda xs: [json.dumps(x) for x in xs]),
    ),
    max_leaves=30,
)
_lines = st.one_of(
    st.builds(
        lambda t, s, v: json.dumps({"t": t, "s": s, "v": v}).encode(),
        st.sampled_from(["t", "x", ""]),
        st.integers(min_value=-1, max_value=9),
        st.lists(_json, max_size=4),
    ),
    st.binary(max_size=40),
    st.sampled_from([DEEP.encode(), b"{", b"NaN", b'{"t": "t", "s": 0, "v": [1e999]}']),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_lines, max_size=10), st.booleans())
def test_any_record_gets_a_verdict(lines, keep_gold):
    """The decode+compare path the grader runs on a submission's record: either the record is
    malformed (BadRecord) or compare returns test -> reason; never anything else."""
    data = b"\n".join(lines)
    if keep_gold:  # hostile lines after a genuine record: the comparison itself is reached
        gold = b"\n".join(json.dumps({"t": "t", "s": s, "v": v}).encode() for s, v in GOLD["t"])
        data = gold + b"\n" + data
    try:
        parsed = probes.parse_record(data)
    except probes.BadRecord:
        return
    problems = probes.compare(GOLD, parsed, rewritten().sites, ["t", "x"])
    assert all(isinstance(v, str) for v in problems.values())
    json.dumps(problems, ensure_ascii=False).encode("utf-8")


@settings(max_examples=200, deadline=None)
@given(_json)
def test_decode_raises_only_bad_record(value):
    try:
        decoded = probes.decode(value)
    except probes.BadRecord:
        return
    record.opaque_inside(decoded)
    assert decoded == decoded or isinstance(decoded, (float, complex)) or _has_nan(decoded)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_json, st.builds(lambda n, s, extra: {"obj": n, "state": s, **extra}, _json, _json,
                                  st.dictionaries(st.sampled_from(_TAGS), _json, max_size=2))))  # fmt: skip
def test_faithful_is_total_and_only_for_what_decodes(value):
    """Any JSON value (objects with any state among them): a bool, never an exception; True only
    for a value decode accepts."""
    verdict = record.faithful(value)
    assert verdict is True or verdict is False
    if verdict:
        probes.decode(value)


def _has_nan(v: object) -> bool:
    if isinstance(v, float):
        return math.isnan(v)
    if isinstance(v, (list, tuple, set, frozenset)):
        return any(_has_nan(x) for x in v)
    if isinstance(v, dict):
        return any(_has_nan(x) for x in v.values())
    return isinstance(v, probes.Opaque)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_lines, max_size=6),
    st.sampled_from(["good", "cut", "junk", "huge_attr"]),
    st.binary(max_size=30),
)
def test_judge_gives_a_verdict_on_any_report(lines, xml_kind, junk):
    """The grader's own entry point: every expected test has a gold record, so hostile lines
    labelled with their ids reach the per-check comparison."""
    expected = TASK.fail_to_pass + TASK.pass_to_pass
    sites = rewritten().sites
    reference = Reference({}, sites, {t: GOLD["t"] for t in expected}, set(), set())
    relabelled = [line.replace(b'"t": "t"', json.dumps({"t": expected[0]})[1:-1].encode()) for line in lines]
    report = _report(_all())
    xml = base64.b64decode(report["xml"])
    report["xml"] = base64.b64encode(
        {"good": xml, "cut": xml[: len(xml) // 2], "junk": junk,
         "huge_attr": xml.replace(b'failures="0"', b'failures="' + b"9" * 5000 + b'"')}[xml_kind]
    ).decode()  # fmt: skip
    report["probes"] = base64.b64encode(b"\n".join(relabelled)).decode()
    result = judge(TASK, report, CANARY, reference)
    assert result.reward in (0.0, 1.0)
    json.dumps(record.sendable(result.info), ensure_ascii=False).encode("utf-8")


def test_a_source_nested_past_the_parsers_limits_is_a_syntax_violation():
    """ast.parse raises RecursionError or MemoryError on these (not SyntaxError); the grader parses
    in a worker thread, as here."""
    sources = [b"x = a" + b".b" * 100_000, b"x = f" + b"()" * 100_000, b"x = " + b"-" * 200_000 + b"1"]
    found: list = []
    worker = threading.Thread(target=lambda: found.extend(check_source("m.py", s) for s in sources))
    worker.start()
    worker.join()
    assert len(found) == 3
    for violations in found:
        assert [v.rule for v in violations] == ["syntax"]
