import pytest
from roman import add, from_roman, is_roman, to_roman


def test_to_roman_single_symbols():
    assert to_roman(1) == "I"
    assert to_roman(5) == "V"
    assert to_roman(10) == "X"
    assert to_roman(50) == "L"
    assert to_roman(100) == "C"
    assert to_roman(500) == "D"
    assert to_roman(1000) == "M"


def test_to_roman_repeated_symbols():
    assert to_roman(3) == "III"
    assert to_roman(8) == "VIII"
    assert to_roman(30) == "XXX"
    assert to_roman(3000) == "MMM"


def test_to_roman_subtractive_pairs():
    assert to_roman(4) == "IV"
    assert to_roman(9) == "IX"
    assert to_roman(40) == "XL"
    assert to_roman(90) == "XC"
    assert to_roman(400) == "CD"
    assert to_roman(900) == "CM"


def test_to_roman_composite_numbers():
    assert to_roman(14) == "XIV"
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(2024) == "MMXXIV"
    assert to_roman(3999) == "MMMCMXCIX"


def test_to_roman_rejects_out_of_range():
    for bad in (0, -1, 4000, 10000):
        with pytest.raises(ValueError):
            to_roman(bad)


def test_to_roman_rejects_non_integers():
    for bad in (1.0, "4", True, None):
        with pytest.raises(TypeError):
            to_roman(bad)


def test_from_roman_additive():
    assert from_roman("I") == 1
    assert from_roman("III") == 3
    assert from_roman("VIII") == 8
    assert from_roman("MDCLXVI") == 1666


def test_from_roman_subtractive():
    assert from_roman("IV") == 4
    assert from_roman("IX") == 9
    assert from_roman("XL") == 40
    assert from_roman("CM") == 900
    assert from_roman("MCMXCIV") == 1994


def test_from_roman_ignores_case_and_spaces():
    assert from_roman("  xiv ") == 14
    assert from_roman("mmxxiv") == 2024


def test_from_roman_rejects_invalid_characters():
    for bad in ("ABC", "X1", "I V"):
        with pytest.raises(ValueError):
            from_roman(bad)


def test_from_roman_rejects_non_canonical_forms():
    for bad in ("IIII", "VV", "IC", "XM", "VX", "MMMM"):
        with pytest.raises(ValueError):
            from_roman(bad)


def test_from_roman_rejects_empty():
    with pytest.raises(ValueError):
        from_roman("   ")


def test_round_trip_over_the_whole_range():
    for n in range(1, 4000):
        assert from_roman(to_roman(n)) == n


def test_is_roman():
    assert is_roman("XLII")
    assert is_roman("mmm")
    assert not is_roman("IIII")
    assert not is_roman("")
    assert not is_roman("Q")


def test_add():
    assert add("II", "II") == "IV"
    assert add("XL", "II") == "XLII"
    assert add("MCM", "XCIX") == "MCMXCIX"
    with pytest.raises(ValueError):
        add("MMM", "M")
