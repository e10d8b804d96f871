"""The dashboards' feed: the progress window samples the workers' shared counters between writes; a sink
that is off is simply not there."""

from __future__ import annotations

import pytest
import torch

from hogwild.protocol import Control
from hogwild.reporting.sinks import NullSink, ProgressWindow, Sinks


class Recorder(NullSink):
    def __init__(self):
        self.rows, self.advanced = [], []

    def scalars(self, values, step):
        self.rows.append((step, dict(values)))

    def advance(self, samples, postfix):
        self.advanced.append((samples, dict(postfix)))


def table(num_workers=2, samples=(0, 0)):
    control = Control(num_workers)
    control.progress[:, Control.SAMPLES] = torch.tensor(samples)
    return control


def publish(control, rank, steps, samples, loss_sum, lr):
    """What a worker's step loop writes to its row (hogwild.worker.main)."""
    control.progress[rank, Control.SAMPLES] += samples
    control.reports[rank, Control.LOSS] += loss_sum
    control.reports[rank, Control.LOSS_STEPS] += steps
    control.reports[rank, Control.LR] = lr


def test_the_window_writes_means_and_rates_per_worker_and_overall():
    control = table(samples=(600, 400))  # a resumed run: 1000 samples before this one
    window = ProgressWindow(control, interval=0.5)
    publish(control, 0, steps=10, samples=640, loss_sum=20.0, lr=0.1)
    publish(control, 1, steps=5, samples=320, loss_sum=5.0, lr=0.3)
    publish(control, 0, steps=10, samples=640, loss_sum=10.0, lr=0.1)
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
    publish(control, 1, steps=5, samples=320, loss_sum=15.0, lr=0.3)
    window.flush(sink)
    assert set(sink.rows[1][1]) >= {"workers/loss/rank_01", "train/loss"}
    assert "workers/loss/rank_00" not in sink.rows[1][1]  # rank 0 published nothing since
    assert window.final_train_loss == pytest.approx((30.0 / 20 + 15.0 / 5) / 2)  # latest each


def test_a_step_taken_while_the_window_writes_is_counted_by_the_next_write():
    control = table()
    window = ProgressWindow(control, interval=0.5)

    class Busy(Recorder):  # a worker steps while the sinks are being written to
        def advance(self, samples, postfix):
            super().advance(samples, postfix)
            publish(control, 1, steps=1, samples=64, loss_sum=2.0, lr=0.1)

    sink = Busy()
    publish(control, 0, steps=10, samples=640, loss_sum=20.0, lr=0.1)
    window.flush(sink)
    window.flush(sink)
    window.flush(sink)  # (the bar ended short of its total when these were lost)
    assert [n for n, _ in sink.advanced] == [640, 64, 64]
    assert sum(n for n, _ in sink.advanced) + 64 == int(control.progress[:, Control.SAMPLES].sum())
    assert sink.rows[1][1]["workers/loss/rank_01"] == pytest.approx(2.0)


def test_samples_without_a_published_loss_still_move_the_rate_and_the_bar():
    control = table()
    window = ProgressWindow(control)
    control.progress[0, Control.SAMPLES] += 64  # a step, its loss not yet published
    sink = Recorder()
    window.flush(sink)
    ((_, values),) = sink.rows
    assert "train/loss" not in values and values["perf/samples_per_second"] > 0
    assert sink.advanced == [(64, {})]


def test_an_empty_window_writes_nothing():
    sink = Recorder()
    window = ProgressWindow(table())
    window.flush(sink)
    assert sink.rows == [] and sink.advanced == [] and window.final_train_loss is None


def test_a_flush_starts_a_new_window():
    control = table()
    window = ProgressWindow(control, interval=3600)
    assert not window.due() and window.seconds_to_due() > 3000
    publish(control, 0, 1, 64, 1.0, 0.1)
    window.flush(Recorder())
    sink = Recorder()
    window.flush(sink)
    assert sink.rows == []


def test_skipped_batches_are_counted_from_the_table():
    control = table()
    window = ProgressWindow(control)
    control.reports[1, Control.SKIPPED] = 3
    publish(control, 1, 1, 64, 1.0, 0.1)
    sink = Recorder()
    window.flush(sink)
    assert window.skipped == 3 and sink.rows[0][1]["train/skipped_steps"] == 3


def test_sinks_fan_out_to_every_sink():
    a, b = Recorder(), Recorder()
    both = Sinks(a, b)
    both.scalars({"x": 1.0}, 5)
    both.advance(3, {})
    assert a.rows == b.rows == [(5, {"x": 1.0})] and a.advanced == b.advanced == [(3, {})]
    NullSink().scalars({"x": 1.0}, 5)  # the do-nothing sink takes everything
