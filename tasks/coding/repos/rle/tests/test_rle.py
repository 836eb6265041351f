import pytest
from rle import compression_ratio, decode, encode, expand, longest_run, runs


def test_runs():
    assert runs("aaabcc") == [("a", 3), ("b", 1), ("c", 2)]
    assert runs([1, 1, 2, 1]) == [(1, 2), (2, 1), (1, 1)]
    assert runs("") == []


def test_runs_single_run():
    assert runs("zzzz") == [("z", 4)]


def test_expand():
    assert expand([("a", 3), ("b", 1)]) == ["a", "a", "a", "b"]
    assert expand([]) == []
    with pytest.raises(ValueError):
        expand([("a", 0)])


def test_expand_inverts_runs():
    data = [3, 3, 3, 0, 7, 7, 3]
    assert expand(runs(data)) == data


def test_encode():
    assert encode("aaabcc") == "3a1b2c"
    assert encode("a") == "1a"
    assert encode("") == ""
    assert encode("  x") == "2 1x"


def test_encode_long_runs():
    assert encode("b" * 12 + "c") == "12b1c"


def test_encode_rejects_digits():
    with pytest.raises(ValueError):
        encode("a1")


def test_decode():
    assert decode("3a1b2c") == "aaabcc"
    assert decode("12b1c") == "b" * 12 + "c"
    assert decode("") == ""


def test_decode_rejects_malformed():
    for bad in ("a", "3", "0a", "2a3", "ab"):
        with pytest.raises(ValueError):
            decode(bad)


def test_round_trip():
    for text in ("hello   world", "mississippi", "x" * 100, "abc", ""):
        assert decode(encode(text)) == text


def test_compression_ratio():
    assert compression_ratio("") == 1.0
    assert compression_ratio("aaaa") == 0.5
    assert compression_ratio("ab") == 2.0


def test_longest_run():
    assert longest_run("aabbbcc") == ("b", 3)
    assert longest_run("xxyy") == ("x", 2)
    assert longest_run("") == ("", 0)
    assert longest_run("q") == ("q", 1)
