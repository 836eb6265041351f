"""A tokenizer and evaluator for arithmetic expressions with variables.

Operators: + - * / and ^ (power, right associative), parentheses, unary minus.
"""

from dataclasses import dataclass

OPERATORS = "+-*/^"
PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "^": 3, "neg": 4}


@dataclass(frozen=True)
class Token:
    kind: str  # "number", "name", "op", "lparen" or "rparen"
    text: str
    pos: int


class ParseError(ValueError):
    def __init__(self, message: str, pos: int) -> None:
        super().__init__(f"{message} at position {pos}")
        self.pos = pos


def tokenize(source: str) -> list[Token]:
    tokens = []
    i = 0
    while i < len(source):
        ch = source[i]
        if ch.isspace():
            i += 1
        elif ch.isdigit() or ch == ".":
            start = i
            while i < len(source) and (source[i].isdigit() or source[i] == "."):
                i += 1
            text = source[start:i]
            if text.count(".") > 1 or text == ".":
                raise ParseError(f"bad number {text!r}", start)
            tokens.append(Token("number", text, start))
        elif ch.isalpha() or ch == "_":
            start = i
            while i < len(source) and (source[i].isalnum() or source[i] == "_"):
                i += 1
            tokens.append(Token("name", source[start:i], start))
        elif ch in OPERATORS:
            tokens.append(Token("op", ch, i))
            i += 1
        elif ch == "(":
            tokens.append(Token("lparen", ch, i))
            i += 1
        elif ch == ")":
            tokens.append(Token("rparen", ch, i))
            i += 1
        else:
            raise ParseError(f"unexpected character {ch!r}", i)
    return tokens


def to_postfix(tokens: list[Token]) -> list[Token]:
    """Shunting-yard: reorders tokens into reverse Polish notation; unary minus becomes "neg"."""
    output: list[Token] = []
    stack: list[Token] = []
    expect_operand = True
    for tok in tokens:
        if tok.kind in ("number", "name"):
            output.append(tok)
            expect_operand = False
        elif tok.kind == "lparen":
            stack.append(tok)
            expect_operand = True
        elif tok.kind == "rparen":
            while stack and stack[-1].kind != "lparen":
                output.append(stack.pop())
            if not stack:
                raise ParseError("unbalanced ')'", tok.pos)
            stack.pop()
            expect_operand = False
        elif expect_operand and tok.text == "-":
            stack.append(Token("op", "neg", tok.pos))
        elif expect_operand:
            raise ParseError(f"operator {tok.text!r} needs a left operand", tok.pos)
        else:
            prec = PRECEDENCE[tok.text]
            while stack and stack[-1].kind == "op":
                top = PRECEDENCE[stack[-1].text]
                if top > prec or (top == prec and tok.text != "^"):
                    output.append(stack.pop())
                else:
                    break
            stack.append(tok)
            expect_operand = True
    if expect_operand and tokens:
        raise ParseError("expression ends with an operator", tokens[-1].pos)
    while stack:
        tok = stack.pop()
        if tok.kind == "lparen":
            raise ParseError("unbalanced '('", tok.pos)
        output.append(tok)
    return output


def evaluate(source: str, variables: dict[str, float] | None = None) -> float:
    variables = variables or {}
    stack: list[float] = []
    for tok in to_postfix(tokenize(source)):
        if tok.kind == "number":
            stack.append(float(tok.text))
        elif tok.kind == "name":
            if tok.text not in variables:
                raise ParseError(f"unknown variable {tok.text!r}", tok.pos)
            stack.append(variables[tok.text])
        elif tok.text == "neg":
            stack.append(-stack.pop())
        else:
            right = stack.pop()
            left = stack.pop()
            if tok.text == "+":
                stack.append(left + right)
            elif tok.text == "-":
                stack.append(left - right)
            elif tok.text == "*":
                stack.append(left * right)
            elif tok.text == "/":
                if right == 0:
                    raise ParseError("division by zero", tok.pos)
                stack.append(left / right)
            else:
                stack.append(left**right)
    if len(stack) != 1:
        raise ParseError("empty expression", 0)
    return stack[0]
