"""Run-length encoding of strings ("aaab" <-> "3a1b") and of arbitrary sequences."""


def runs(items) -> list[tuple[object, int]]:
    """Consecutive equal items as (item, count) pairs."""
    result: list[tuple[object, int]] = []
    for item in items:
        if result and result[-1][0] == item:
            result[-1] = (item, result[-1][1] + 1)
        else:
            result.append((item, 1))
    return result


def expand(pairs: list[tuple[object, int]]) -> list:
    """The inverse of ``runs``."""
    out = []
    for item, count in pairs:
        if count < 1:
            raise ValueError(f"count {count} must be positive")
        out.extend([item] * count)
    return out


def encode(text: str) -> str:
    """Each run as its length followed by its character; digits cannot be encoded."""
    if any(ch.isdigit() for ch in text):
        raise ValueError("text must not contain digits")
    return "".join(f"{count}{ch}" for ch, count in runs(text))


def decode(code: str) -> str:
    out = []
    count = 0
    seen_digit = False
    for ch in code:
        if ch.isdigit():
            count = count * 10 + int(ch)
            seen_digit = True
        else:
            if not seen_digit:
                raise ValueError(f"character {ch!r} has no count")
            if count == 0:
                raise ValueError("a count must not be zero")
            out.append(ch * count)
            count = 0
            seen_digit = False
    if seen_digit:
        raise ValueError("code ends with a count")
    return "".join(out)


def compression_ratio(text: str) -> float:
    """len(encode(text)) / len(text); 1.0 for the empty string."""
    if not text:
        return 1.0
    return len(encode(text)) / len(text)


def longest_run(text: str) -> tuple[str, int]:
    """The first longest run as (character, length); ("", 0) for the empty string."""
    best = ("", 0)
    for ch, count in runs(text):
        if count > best[1]:
            best = (ch, count)
    return best
