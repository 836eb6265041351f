import datetime

import pytest
from dates import (
    day_of_year,
    days_between,
    days_in_month,
    format_iso,
    is_leap_year,
    ordinal,
    parse_date,
    validate,
    weekday,
)


def test_leap_years():
    assert is_leap_year(2024)
    assert is_leap_year(2000)
    assert is_leap_year(1600)
    assert not is_leap_year(2023)
    assert not is_leap_year(1900)
    assert not is_leap_year(2100)


def test_days_in_month():
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29
    assert days_in_month(2023, 4) == 30
    assert days_in_month(2023, 11) == 30
    assert days_in_month(2023, 12) == 31


def test_days_in_month_rejects_bad_months():
    for bad in (0, 13, -1):
        with pytest.raises(ValueError):
            days_in_month(2023, bad)


def test_validate():
    assert validate(2024, 2, 29) == (2024, 2, 29)
    for bad in ((2023, 2, 29), (2023, 4, 31), (2023, 1, 0), (0, 1, 1), (2023, 13, 1)):
        with pytest.raises(ValueError):
            validate(*bad)


def test_day_of_year():
    assert day_of_year(2023, 1, 1) == 1
    assert day_of_year(2023, 2, 1) == 32
    assert day_of_year(2023, 3, 1) == 60
    assert day_of_year(2024, 3, 1) == 61
    assert day_of_year(2023, 12, 31) == 365
    assert day_of_year(2024, 12, 31) == 366


def test_ordinal_matches_datetime():
    for y, m, d in ((1, 1, 1), (1999, 12, 31), (2000, 2, 29), (2024, 7, 14), (1900, 3, 1), (2100, 1, 1)):
        assert ordinal(y, m, d) == datetime.date(y, m, d).toordinal()


def test_weekday_matches_datetime():
    for y, m, d in ((2024, 1, 1), (2024, 3, 10), (1969, 7, 20), (2000, 1, 1), (2023, 12, 31)):
        assert weekday(y, m, d) == datetime.date(y, m, d).weekday()


def test_days_between():
    assert days_between((2024, 1, 1), (2024, 1, 31)) == 30
    assert days_between((2023, 12, 31), (2024, 1, 1)) == 1
    assert days_between((2024, 3, 1), (2024, 2, 1)) == -29
    assert days_between((2000, 1, 1), (2001, 1, 1)) == 366


def test_parse_iso():
    assert parse_date("2024-03-05") == (2024, 3, 5)
    assert parse_date("  1999-12-31 ") == (1999, 12, 31)


def test_parse_european_day_first():
    assert parse_date("5/3/2024") == (2024, 3, 5)
    assert parse_date("31/12/1999") == (1999, 12, 31)


def test_parse_written():
    assert parse_date("Mar 5, 2024") == (2024, 3, 5)
    assert parse_date("December 25, 2023") == (2023, 12, 25)
    assert parse_date("sept. 1, 2020") == (2020, 9, 1)


def test_parse_rejects_invalid():
    for bad in ("2024-02-30", "32/1/2024", "Foo 5, 2024", "2024/03/05", "", "tomorrow"):
        with pytest.raises(ValueError):
            parse_date(bad)


def test_format_iso():
    assert format_iso(2024, 3, 5) == "2024-03-05"
    assert format_iso(33, 1, 9) == "0033-01-09"
    with pytest.raises(ValueError):
        format_iso(2023, 2, 29)
