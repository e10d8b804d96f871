"""Staleness: how many updates other workers applied between a worker's read of the shared
parameters (its forward pass) and its own write (its optimizer step).

Hogwild's promise rests on that number staying small next to the number of steps an epoch takes.
Each worker counts it exactly, without locks: every rank owns its row of the shared progress
table (its step count), so the others' updates are the sum of the other rows, read before the
forward pass and again before the step. The values go into a per-rank histogram in shared memory
(`Control.staleness`, one row per rank, written only by its owner); the orchestrator reads the
histograms whenever it likes and turns them into mean / p95 / max.
"""

from __future__ import annotations

import numpy as np

BINS = 256  # exact counts for staleness 0..255
OVER, SUM, MAX = BINS, BINS + 1, BINS + 2  # values >= 256, sum of all values, largest value
COLUMNS = BINS + 3


def record(row: np.ndarray, value: int) -> None:
    """Add one step's staleness to a rank's row (a numpy view of shared memory)."""
    row[value if value < BINS else OVER] += 1
    row[SUM] += value
    if value > row[MAX]:
        row[MAX] = value


def stats(row: np.ndarray) -> dict[str, float] | None:
    """mean / p95 / max of one row (or of the sum of rows, with MAX taken over them); None before any step."""
    counts = row[: OVER + 1]
    n = int(counts.sum())
    if n == 0:
        return None
    p95_bin = int(np.searchsorted(np.cumsum(counts), 0.95 * n))
    return {
        "mean": float(row[SUM]) / n,
        "p95": float(p95_bin if p95_bin < BINS else row[MAX]),  # past the bins, the max bounds it
        "max": float(row[MAX]),
        "steps": n,
    }


def summarize(table: np.ndarray) -> dict | None:
    """Global and per-rank figures from the whole (workers x COLUMNS) table."""
    total = table.sum(axis=0)
    total[MAX] = table[:, MAX].max(initial=0)
    overall = stats(total)
    if overall is None:
        return None
    return {
        **overall,
        "per_worker": [{"rank": r, **(stats(row) or {})} for r, row in enumerate(table)],
    }


def scalars(table: np.ndarray) -> dict[str, float]:
    """TensorBoard tags: staleness/{mean,p95,max} and workers/staleness/rank_NN (mean)."""
    summary = summarize(table)
    if summary is None:
        return {}
    values = {f"staleness/{k}": summary[k] for k in ("mean", "p95", "max")}
    for w in summary["per_worker"]:
        if "mean" in w:
            values[f"workers/staleness/rank_{w['rank']:02d}"] = w["mean"]
    return values
