"""One cadence rule ("every N steps or every N seconds") for checkpoints, node sync and logging."""

from __future__ import annotations

import math

from hogwild.cadence import Cadence


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_every_n_steps_counts_from_the_last_mark():
    every = Cadence(every_n=10, clock=Clock())
    assert not every.due(9)
    assert every.due(10)
    every.mark(12)
    assert not every.due(21) and every.due(22)


def test_every_n_seconds_counts_from_the_last_mark():
    clock = Clock()
    every = Cadence(every_seconds=5.0, clock=clock)
    clock.now = 4.9
    assert not every.due(0)
    clock.now = 5.0
    assert every.due(0)
    every.mark(0)
    clock.now = 9.0
    assert not every.due(0) and math.isclose(every.seconds_left(), 1.0)


def test_either_half_makes_it_due():
    clock = Clock()
    every = Cadence(every_n=100, every_seconds=60.0, clock=clock)
    assert every.due(100)
    clock.now = 61.0
    assert every.due(1)


def test_both_halves_off_is_never_due():
    clock = Clock()
    every = Cadence(clock=clock)
    clock.now = 1e9
    assert not every.enabled and not every.due(10**9) and every.seconds_left() == math.inf


def test_a_start_count_is_where_a_resumed_run_stands():
    every = Cadence(every_n=10, start=95, clock=Clock())
    assert not every.due(100) and every.due(105)
