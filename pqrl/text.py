"""Text that came from outside (a sandbox, an agent's arguments) made safe to send on: bounded, so a
huge echoed argument cannot overflow a reply, and encodable as UTF-8, so a lone surrogate (a file
name that is not UTF-8) cannot fail the reply that carries it."""

from __future__ import annotations

__all__ = ["clipped", "encodable"]


def encodable(text: str) -> str:
    """``text`` with lone surrogates as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def clipped(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters (saying how long it was), and ``encodable``."""
    if len(text) > limit:
        text = f"{text[: limit - 40]}... ({len(text)} characters in all)"
    return encodable(text)
