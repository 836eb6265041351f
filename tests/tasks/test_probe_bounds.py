"""What the recorder (tasks/coding/probe_runtime.py) does with the checks real suites make: an
expected exception that is not an ``Exception``, values that contain themselves, records larger
than the runner keeps, threads recording at once. Each record must stay whole JSON lines the host
parses, and the host must know which tests it can still judge by values."""

from __future__ import annotations

import json
import os
import threading

import pytest

from tasks.coding import probe_runtime, probes

TEST = "tests/test_m.py::test_values"


class Abort(BaseException):  # as more_itertools.AbortThread
    pass


@pytest.fixture
def pipe(monkeypatch):
    r, w = os.pipe()
    monkeypatch.setattr(probe_runtime, "_FD", w)
    monkeypatch.setattr(probe_runtime, "_LEFT", [probe_runtime._MAX_RECORD, None, probe_runtime._MAX_TEST])
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(r, 1 << 16), b"")))
    reader.start()

    def close() -> bytes:  # pytest sets PYTEST_CURRENT_TEST after fixtures: the tests set it
        os.close(w)
        reader.join()
        os.close(r)
        return b"".join(chunks)

    return close


@pytest.mark.parametrize("exc", [Abort, SystemExit, KeyboardInterrupt, GeneratorExit])
def test_a_raises_block_swallows_what_pytest_raises_would_and_records_its_class(pipe, exc, monkeypatch):
    monkeypatch.setenv("PYTEST_CURRENT_TEST", f"{TEST} (call)")
    with probe_runtime.raises(0):
        raise exc("stop")
    probe_runtime.probe(1, (), lambda: "went on")  # the test goes on, as after pytest.raises(E)
    record = probes.parse_record(pipe())[TEST]
    assert record[0][1][0]["!raised"][0].endswith(exc.__qualname__)
    assert record[1] == (1, ["went on"])


def test_a_value_inside_itself_is_marked_not_expanded():
    node: list = [None, None, "k", "v"]  # a doubly linked ring, as an LRU cache keeps one
    ring = [node]
    for i in range(30):
        new = [ring[-1], None, i, i]
        ring[-1][1] = new
        ring.append(new)
    ring[-1][1], node[0] = node, ring[-1]
    text = json.dumps(probe_runtime.encode({"anchor": node}))
    assert '"cycle"' in text and len(text) < 20_000, len(text)  # was the whole node budget, 1.5 MB
    loop: list = [1]
    loop.append(loop)
    assert probe_runtime.encode(loop) == {"list": [1, {"cycle": 1}], "len": 2}
    shared = [1, 2]  # the same value twice, not inside itself: encoded both times
    assert probe_runtime.encode([shared, shared])["list"][1] == probe_runtime.encode(shared)


def test_a_test_past_its_share_is_cut_with_a_marker_and_the_next_test_records(pipe, monkeypatch):
    monkeypatch.setattr(probe_runtime, "_MAX_TEST", 3000)
    monkeypatch.setattr(probe_runtime, "_LEFT", [5000, None, 3000])
    monkeypatch.setenv("PYTEST_CURRENT_TEST", f"{TEST} (call)")
    for i in range(10):
        probe_runtime.probe(i, (), lambda: "x" * 500)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_m.py::test_next (call)")
    probe_runtime.probe(20, (), lambda: 7)
    for i in range(30):  # past the record's limit: one marker, then nothing from any test
        probe_runtime.probe(30 + i, (), lambda: "y" * 500)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_m.py::test_last (call)")
    probe_runtime.probe(99, (), lambda: 1)
    raw = pipe()
    record = probes.parse_record(raw)  # whole lines: parses
    first, second = record[TEST], record["tests/test_m.py::test_next"]
    assert first[-1][1] == [probe_runtime.OVERFLOW] and 3 <= len(first) <= 6
    assert second[0] == (20, [7]) and second[-1][1] == [probe_runtime.OVERFLOW]
    assert "tests/test_m.py::test_last" not in record and len(raw) <= 5200
    assert probes.overflowed(record) == {TEST, "tests/test_m.py::test_next"}


def test_a_cut_test_is_judged_by_its_outcome_not_failed_between_gold_runs():
    cut = [(0, ["a"]), (1, [probe_runtime.OVERFLOW])]
    first = {"t::a": cut, "t::b": [(2, [1])]}
    entries, tests = probes.unstable_entries(first, {"t::a": cut[:1], "t::b": [(2, [1])]})
    assert tests == {"t::a"} and entries == set()


def test_threads_recording_at_once_write_whole_lines(pipe, monkeypatch):
    monkeypatch.setenv("PYTEST_CURRENT_TEST", f"{TEST} (call)")
    big = "z" * 9000  # past PIPE_BUF: one os.write per line is not atomic

    def work(k: int) -> None:
        for i in range(10):
            probe_runtime.probe(k * 100 + i, (), lambda: big)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    record = probes.parse_record(pipe())
    assert len(record[TEST]) == 40 and all(v == [big] for _, v in record[TEST])


class _Recursing:
    def __eq__(self, other: object) -> bool:
        raise RecursionError("maximum recursion depth exceeded in comparison")

    __hash__ = object.__hash__


def test_an_assert_that_raises_inside_pytest_raises_raises_as_the_original(pipe, monkeypatch):
    """``with pytest.raises(RuntimeError): assert coll == remap(coll)`` (boltons): the comparison's
    error is what the block expects; recorded and swallowed by the probe, the gold failed its own
    rewritten test. Now it is recorded and raised on, and the gold's record matches itself."""
    src = "import pytest\n\n\ndef test_r():\n    with pytest.raises(RuntimeError):\n        assert R() == 1\n"
    inst = probes.instrument({"t.py": src})
    (probe_site,) = [i for i, s in inst.sites.items() if s.kind != "raises"]
    (raises_site,) = [i for i, s in inst.sites.items() if s.kind == "raises"]
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::test_r (call)")
    with probe_runtime.raises(raises_site):
        probe_runtime.probe(probe_site, ("==",), _Recursing, lambda: 1)
    gold = probes.parse_record(pipe())
    assert gold["t.py::test_r"][0][1][-1]["!raised"][0] == "builtins.RecursionError"
    assert probes.compare(gold, gold, inst.sites, ["t.py::test_r"]) == {}
    no_raise = {"t.py::test_r": [(probe_site, [{"!truth": True}]), gold["t.py::test_r"][1]]}
    assert probes.compare(gold, no_raise, inst.sites, ["t.py::test_r"])  # not what the gold did
    other = [
        {
            "!raised": [
                "builtins.ValueError",
                "builtins.Exception",
                "builtins.BaseException",
                "builtins.object",
            ]
        }
    ]
    raised_else = {"t.py::test_r": [(probe_site, other), gold["t.py::test_r"][1]]}
    assert probes.compare(gold, raised_else, inst.sites, ["t.py::test_r"])
