"""Staleness telemetry: the histogram arithmetic, and what a real run reports."""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.reporting import staleness


def row_of(values) -> np.ndarray:
    row = np.zeros(staleness.COLUMNS, dtype=np.int64)
    for v in values:
        staleness.record(row, v)
    return row


def test_stats_are_mean_p95_and_max_of_what_was_recorded():
    values = [0] * 90 + [1] * 5 + [7] * 4 + [12]
    s = staleness.stats(row_of(values))
    assert s == {"mean": pytest.approx(np.mean(values)), "p95": 1.0, "max": 12.0, "steps": 100}


def test_values_past_the_bins_are_counted_and_bound_p95_by_the_max():
    s = staleness.stats(row_of([300] * 10))
    assert s == {"mean": 300.0, "p95": 300.0, "max": 300.0, "steps": 10}


def test_nothing_recorded_means_no_figures():
    assert staleness.stats(row_of([])) is None
    assert staleness.summarize(np.zeros((2, staleness.COLUMNS), dtype=np.int64)) is None
    assert staleness.scalars(np.zeros((2, staleness.COLUMNS), dtype=np.int64)) == {}


def test_summary_pools_the_ranks_and_keeps_each():
    table = np.stack([row_of([0, 0, 2]), row_of([4])])
    s = staleness.summarize(table)
    assert (s["mean"], s["max"], s["steps"]) == (1.5, 4.0, 4)
    assert [(w["rank"], w["max"]) for w in s["per_worker"]] == [(0, 2.0), (1, 4.0)]
    assert set(staleness.scalars(table)) == {
        "staleness/mean",
        "staleness/p95",
        "staleness/max",
        "workers/staleness/rank_00",
        "workers/staleness/rank_01",
    }
