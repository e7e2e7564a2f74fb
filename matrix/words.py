"""How counts read in what the app prints: "1 point", "2 points"."""

from __future__ import annotations


def count(n: int, noun: str, plural: str = "") -> str:
    """``n`` and the noun in the number it takes (``plural``: when not noun + s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
