"""How numbers read in what a user sees: "1 worker", "2 workers", "14,380 samples"."""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else many or word + 's'}"
