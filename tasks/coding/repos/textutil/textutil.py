"""String utilities: slugs, word wrapping, truncation, case conversion, palindromes, word counts."""

import re
from collections import Counter

WORD = re.compile(r"[a-z0-9']+")


def slugify(text: str, separator: str = "-") -> str:
    """Lower-case ASCII words joined by ``separator``: "Hello, World!" -> "hello-world"."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return separator.join(words)


def wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap; a word longer than ``width`` gets a line of its own."""
    if width < 1:
        raise ValueError("width must be at least 1")
    lines: list[str] = []
    current = ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current = current + " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def truncate(text: str, limit: int, suffix: str = "...") -> str:
    """``text`` cut to at most ``limit`` characters, ending in ``suffix`` when cut."""
    if limit < len(suffix):
        raise ValueError("limit must leave room for the suffix")
    if len(text) <= limit:
        return text
    return text[: limit - len(suffix)] + suffix


def camel_to_snake(name: str) -> str:
    """ "parseHTTPResponse" -> "parse_http_response"."""
    out = []
    for i, ch in enumerate(name):
        if ch.isupper():
            prev_lower = i > 0 and name[i - 1].islower()
            next_lower = i + 1 < len(name) and name[i + 1].islower()
            if i > 0 and (prev_lower or (next_lower and name[i - 1].isupper())):
                out.append("_")
            out.append(ch.lower())
        else:
            out.append(ch)
    return "".join(out)


def is_palindrome(text: str) -> bool:
    """Ignores case and everything but letters and digits."""
    chars = [ch.lower() for ch in text if ch.isalnum()]
    return chars == chars[::-1]


def word_counts(text: str, top: int = 3) -> list[tuple[str, int]]:
    """The ``top`` most frequent words (ties broken alphabetically)."""
    counts = Counter(WORD.findall(text.lower()))
    ranked = sorted(counts.items(), key=lambda pair: (-pair[1], pair[0]))
    return ranked[:top]


def center(text: str, width: int, fill: str = " ") -> str:
    """``text`` padded on both sides to ``width``; the extra character goes to the right."""
    if len(text) >= width:
        return text
    total = width - len(text)
    left = total // 2
    return fill * left + text + fill * (total - left)
