"""Hostile documents of issue 16 (items 2 and 3), shared by the limits' tests."""

from __future__ import annotations

# 100,000 nested arrays: Python's JSON parser and PyYAML's composer recurse once per level.
DEEP = "[" * 100_000 + "]" * 100_000


def billion_laughs(top: str = "lol") -> str:
    """The classic: nine levels of nine aliases, 9**9 (387,420,489) strings once expanded; 414 bytes."""
    lines = [f'a: &a ["{top}", "{top}", "{top}", "{top}", "{top}", "{top}", "{top}", "{top}", "{top}"]']
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    return "\n".join(lines) + "\n"


def long_laughs(length: int = 22_000, first: int = 100, second: int = 97) -> str:
    """Few nodes, many bytes: one string of ``length`` characters, a list of
    ``first`` aliases of it and a list of ``second`` aliases of that list,
    so ``length * first * second`` characters once expanded (213 MB by
    default, in a 23 KB text of 9,904 nodes: under the node limit)."""
    return f"s: &s {'x' * length}\nl: &l [{', '.join(['*s'] * first)}]\nm: [{', '.join(['*l'] * second)}]\n"
