"""How numbers and tables read in what a user sees: "1 worker", "2 workers", "14,380 samples",
and rows of text cells in aligned columns (the sweep table, the benchmark's tables).
"""

from __future__ import annotations

import os


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def print_cells(cells: list[list[str]], left: int, last_left: bool = False) -> None:
    """Rows of text cells in aligned columns, the first row a header underlined with dashes;
    the first `left` columns are left-aligned (names), the rest right-aligned (figures), but
    the last one with `last_left` (a path)."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lefts = {*range(left), *([len(widths) - 1] if last_left else [])}
    for i, row in enumerate(cells):
        cols = enumerate(zip(row, widths))
        print("  ".join((c.ljust(w) if j in lefts else c.rjust(w)) for j, (c, w) in cols).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def shown_path(folder: str) -> str:
    """A folder as the console shows it: relative to here, unless it lies above."""
    rel = os.path.relpath(folder)
    return folder if rel.startswith("..") else rel
