import pytest
from textutil import camel_to_snake, center, is_palindrome, slugify, truncate, word_counts, wrap


def test_slugify():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("  Many   spaces here ") == "many-spaces-here"
    assert slugify("Version 2.0 released", separator="_") == "version_2_0_released"
    assert slugify("!!!") == ""


def test_wrap_basic():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_exact_fit():
    assert wrap("aaa bbb", 7) == ["aaa bbb"]
    assert wrap("aaa bbb", 6) == ["aaa", "bbb"]


def test_wrap_long_words_and_empty():
    assert wrap("extraordinarily long", 5) == ["extraordinarily", "long"]
    assert wrap("", 5) == []
    assert wrap("   ", 5) == []
    with pytest.raises(ValueError):
        wrap("x", 0)


def test_truncate():
    assert truncate("hello world", 8) == "hello..."
    assert truncate("hello", 5) == "hello"
    assert truncate("hello", 10) == "hello"
    assert truncate("hello world", 6, suffix="~") == "hello~"


def test_truncate_limit_too_small():
    with pytest.raises(ValueError):
        truncate("hello", 2)
    assert truncate("hello", 3) == "..."


def test_camel_to_snake():
    assert camel_to_snake("camelCase") == "camel_case"
    assert camel_to_snake("CamelCase") == "camel_case"
    assert camel_to_snake("parseHTTPResponse") == "parse_http_response"
    assert camel_to_snake("already_snake") == "already_snake"
    assert camel_to_snake("ID") == "id"
    assert camel_to_snake("getX") == "get_x"


def test_is_palindrome():
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert is_palindrome("")
    assert is_palindrome("No 'x' in Nixon")
    assert not is_palindrome("palindrome")
    assert not is_palindrome("ab")


def test_word_counts():
    text = "the cat and the hat and the bat"
    assert word_counts(text) == [("the", 3), ("and", 2), ("bat", 1)]
    assert word_counts(text, top=1) == [("the", 3)]
    assert word_counts("") == []


def test_word_counts_ignores_case_and_punctuation():
    assert word_counts("Go! go, GO? stop.", top=2) == [("go", 3), ("stop", 1)]


def test_center():
    assert center("ab", 6) == "  ab  "
    assert center("ab", 5) == " ab  "
    assert center("abc", 2) == "abc"
    assert center("x", 4, fill="*") == "*x**"
