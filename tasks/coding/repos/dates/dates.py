"""Calendar arithmetic on (year, month, day) triples, and a parser for three date formats."""

import re

MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS_BEFORE_MONTH = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334]
ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
EUROPEAN = re.compile(r"(\d{1,2})/(\d{1,2})/(\d{4})")
WRITTEN = re.compile(r"([A-Za-z]{3})[a-z]*\.? (\d{1,2}), (\d{4})")


def is_leap_year(year: int) -> bool:
    """Gregorian rule: every 4th year, except centuries not divisible by 400."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year: int, month: int) -> int:
    if month < 1 or month > 12:
        raise ValueError(f"month {month} is outside 1..12")
    if month == 2:
        return 29 if is_leap_year(year) else 28
    if month in (4, 6, 9, 11):
        return 30
    return 31


def validate(year: int, month: int, day: int) -> tuple[int, int, int]:
    if year < 1:
        raise ValueError(f"year {year} is before year 1")
    if day < 1 or day > days_in_month(year, month):
        raise ValueError(f"day {day} is not in {year}-{month:02d}")
    return year, month, day


def day_of_year(year: int, month: int, day: int) -> int:
    """1 for January 1st."""
    validate(year, month, day)
    extra = 1 if month > 2 and is_leap_year(year) else 0
    return DAYS_BEFORE_MONTH[month - 1] + extra + day


def ordinal(year: int, month: int, day: int) -> int:
    """Days since 0001-01-01 counted from 1 (the same numbering as datetime.date.toordinal)."""
    y = year - 1
    return y * 365 + y // 4 - y // 100 + y // 400 + day_of_year(year, month, day)


def weekday(year: int, month: int, day: int) -> int:
    """0 for Monday through 6 for Sunday."""
    return (ordinal(year, month, day) + 6) % 7


def days_between(start: tuple[int, int, int], end: tuple[int, int, int]) -> int:
    """``end`` minus ``start`` in days (negative when ``end`` comes first)."""
    return ordinal(*end) - ordinal(*start)


def parse_date(text: str) -> tuple[int, int, int]:
    """Parses "2024-03-05", "5/3/2024" (day first) or "Mar 5, 2024" into (year, month, day)."""
    text = text.strip()
    match = ISO.fullmatch(text)
    if match:
        year, month, day = (int(g) for g in match.groups())
        return validate(year, month, day)
    match = EUROPEAN.fullmatch(text)
    if match:
        day, month, year = (int(g) for g in match.groups())
        return validate(year, month, day)
    match = WRITTEN.fullmatch(text)
    if match:
        name = match.group(1).lower()
        if name not in MONTHS:
            raise ValueError(f"unknown month {match.group(1)!r}")
        return validate(int(match.group(3)), MONTHS.index(name) + 1, int(match.group(2)))
    raise ValueError(f"unrecognised date {text!r}")


def format_iso(year: int, month: int, day: int) -> str:
    validate(year, month, day)
    return f"{year:04d}-{month:02d}-{day:02d}"
