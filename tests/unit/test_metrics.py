"""The dashboards' feed: the progress window aggregates worker reports between writes; a sink
that is off is simply not there."""

from __future__ import annotations

import pytest

from hogwild.metrics import NullSink, ProgressWindow, Sinks


class Recorder(NullSink):
    def __init__(self):
        self.rows, self.advanced = [], []

    def scalars(self, values, step):
        self.rows.append((step, dict(values)))

    def advance(self, samples, postfix):
        self.advanced.append((samples, dict(postfix)))


def test_the_window_writes_means_and_rates_per_worker_and_overall():
    window = ProgressWindow(interval=0.5, samples_seen=1000)
    window.add(0, steps=10, samples=640, loss_sum=20.0, lr=0.1)
    window.add(1, steps=5, samples=320, loss_sum=5.0, lr=0.3)
    window.add(0, steps=10, samples=640, loss_sum=10.0, lr=0.1)
    sink = Recorder()
    window.flush(sink)
    ((step, values),) = sink.rows
    assert step == 1000 + 1600  # the x axis: samples seen by all workers, resumed ones included
    assert values["train/loss"] == pytest.approx(35.0 / 25)
    assert values["workers/loss/rank_00"] == pytest.approx(30.0 / 20)
    assert values["workers/loss/rank_01"] == pytest.approx(1.0)
    assert values["train/lr"] == pytest.approx(0.2)
    assert values["perf/samples_per_second"] > 0
    assert sink.advanced == [(1600, {"loss": "1.4000"})]
    assert window.final_train_loss == pytest.approx(
        (10.0 / 10 + 1.0) / 2
    )  # each rank's latest mean


def test_an_empty_window_writes_nothing():
    sink = Recorder()
    window = ProgressWindow()
    window.flush(sink)
    assert sink.rows == [] and window.final_train_loss is None


def test_a_flush_starts_a_new_window():
    window = ProgressWindow(interval=3600)
    assert not window.due()
    window.add(0, 1, 64, 1.0, 0.1)
    window.flush(Recorder())
    sink = Recorder()
    window.flush(sink)
    assert sink.rows == []


def test_sinks_fan_out_to_every_sink():
    a, b = Recorder(), Recorder()
    both = Sinks(a, b)
    both.scalars({"x": 1.0}, 5)
    both.advance(3, {})
    assert a.rows == b.rows == [(5, {"x": 1.0})] and a.advanced == b.advanced == [(3, {})]
    NullSink().scalars({"x": 1.0}, 5)  # the do-nothing sink takes everything
