import pytest
from tokenizer import ParseError, Token, evaluate, to_postfix, tokenize


def kinds(source):
    return [(t.kind, t.text) for t in tokenize(source)]


def postfix(source):
    return " ".join(t.text for t in to_postfix(tokenize(source)))


def test_tokenize_numbers_names_and_operators():
    assert kinds("x1 + 2.5*y") == [("name", "x1"), ("op", "+"), ("number", "2.5"), ("op", "*"), ("name", "y")]


def test_tokenize_parens_and_positions():
    tokens = tokenize("(a - 10)")
    assert tokens[0] == Token("lparen", "(", 0)
    assert tokens[1] == Token("name", "a", 1)
    assert tokens[3] == Token("number", "10", 5)
    assert tokens[4] == Token("rparen", ")", 7)


def test_tokenize_underscores_and_leading_dot():
    assert kinds("_rate_2 .5") == [("name", "_rate_2"), ("number", ".5")]


def test_tokenize_empty_and_spaces():
    assert tokenize("") == []
    assert tokenize("   ") == []


def test_tokenize_rejects_bad_input():
    with pytest.raises(ParseError) as err:
        tokenize("1 + $")
    assert err.value.pos == 4
    with pytest.raises(ParseError):
        tokenize("1.2.3")
    with pytest.raises(ParseError):
        tokenize(" . ")


def test_postfix_precedence():
    assert postfix("1 + 2 * 3") == "1 2 3 * +"
    assert postfix("1 * 2 + 3") == "1 2 * 3 +"


def test_postfix_left_associative():
    assert postfix("8 - 3 - 2") == "8 3 - 2 -"
    assert postfix("8 / 4 / 2") == "8 4 / 2 /"


def test_postfix_power_is_right_associative():
    assert postfix("2 ^ 3 ^ 2") == "2 3 2 ^ ^"


def test_postfix_parentheses():
    assert postfix("(1 + 2) * 3") == "1 2 + 3 *"


def test_postfix_unary_minus():
    assert postfix("-x + 1") == "x neg 1 +"
    assert postfix("2 * -3") == "2 3 neg *"


def test_postfix_errors():
    for bad in ("(1 + 2", "1 + 2)", "* 3", "1 +", "1 + * 2"):
        with pytest.raises(ParseError):
            to_postfix(tokenize(bad))


def test_evaluate_arithmetic():
    assert evaluate("1 + 2 * 3") == 7
    assert evaluate("(1 + 2) * 3") == 9
    assert evaluate("10 - 4 - 3") == 3
    assert evaluate("12 / 4 / 3") == 1
    assert evaluate("2 ^ 3 ^ 2") == 512


def test_evaluate_unary_minus():
    assert evaluate("-3 + 5") == 2
    assert evaluate("-(2 + 3)") == -5
    assert evaluate("4 * -2") == -8
    assert evaluate("--4") == 4


def test_evaluate_variables():
    assert evaluate("rate * hours", {"rate": 12.5, "hours": 4}) == 50
    with pytest.raises(ParseError):
        evaluate("a + 1")


def test_evaluate_errors():
    with pytest.raises(ParseError):
        evaluate("1 / 0")
    with pytest.raises(ParseError):
        evaluate("")
    with pytest.raises(ParseError):
        evaluate("1 2")
