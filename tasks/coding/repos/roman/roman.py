"""Roman numerals: conversion in both directions for 1..3999, with strict validation."""

VALUES = [
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
]
DIGITS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
MAX_VALUE = 3999


def to_roman(number: int) -> str:
    """Returns the canonical numeral of ``number`` (1 to 3999)."""
    if isinstance(number, bool) or not isinstance(number, int):
        raise TypeError("number must be an int")
    if number < 1 or number > MAX_VALUE:
        raise ValueError(f"{number} is outside 1..{MAX_VALUE}")
    parts = []
    for value, symbol in VALUES:
        count, number = divmod(number, value)
        parts.append(symbol * count)
    return "".join(parts)


def from_roman(text: str) -> int:
    """Parses a canonical numeral; case and surrounding spaces are ignored."""
    text = text.strip().upper()
    if not text:
        raise ValueError("empty numeral")
    total = 0
    for i, ch in enumerate(text):
        if ch not in DIGITS:
            raise ValueError(f"invalid character {ch!r}")
        value = DIGITS[ch]
        if i + 1 < len(text) and DIGITS.get(text[i + 1], 0) > value:
            total -= value
        else:
            total += value
    if total < 1 or total > MAX_VALUE or to_roman(total) != text:
        raise ValueError(f"{text!r} is not a canonical numeral")
    return total


def is_roman(text: str) -> bool:
    """True when ``text`` is a canonical numeral."""
    try:
        from_roman(text)
    except ValueError:
        return False
    return True


def add(a: str, b: str) -> str:
    """The sum of two numerals, as a numeral."""
    return to_roman(from_roman(a) + from_roman(b))
