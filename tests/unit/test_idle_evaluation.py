"""Evaluations that wait for an idle core: the weights of the moment they were due, in the order
they were due, at once where a core is idle, after `wait_seconds` or the workers where none is."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from hogwild.run import idle_evaluation
from hogwild.run.idle_evaluation import EvaluationScheduler, IdleEvaluations, runnable_threads
from tests.support import wait_until


class Cores:
    """A fake /proc/loadavg: how many threads are runnable."""

    def __init__(self, runnable: int):
        self.runnable = runnable

    def __call__(self) -> int:
        return self.runnable


def recorder(seen: list, gate: threading.Event | None = None):
    def evaluate(model, label):
        if gate is not None:
            gate.wait(timeout=30)
        seen.append((label, float(model.weight.sum())))
        return {"eval/weight": float(model.weight.sum())}

    return evaluate


def model_with(value: float) -> torch.nn.Linear:
    m = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        m.weight.fill_(value)
    return m


def busy(cores: int) -> Cores:
    return Cores(cores + 1)  # the workers and this thread: no core idle


def test_an_idle_core_starts_the_evaluation_on_the_second_look():
    seen, cores = [], Cores(1)  # only this thread runs
    ev = IdleEvaluations(recorder(seen), wait_seconds=60, runnable=cores, cores=2)
    assert ev.submit(model_with(1.0), "epoch 1/3", 100)
    assert not ev.queue and not ev.busy and not seen  # one look is not enough
    ev.poll()
    assert wait_until(lambda: ev.ready, timeout=30)
    assert ev.completed() == [("epoch 1/3", 100, {"eval/weight": 2.0})]
    ev.close()


def test_busy_cores_hold_the_weights_of_the_moment_it_was_due_until_the_drain():
    seen = []
    ev = IdleEvaluations(recorder(seen), wait_seconds=60, runnable=busy(2), cores=2)
    model = model_with(1.0)
    ev.submit(model, "epoch 1/3", 100)
    with torch.no_grad():
        model.weight.fill_(5.0)  # the workers go on
    ev.submit(model, "epoch 2/3", 200)
    for _ in range(5):
        ev.poll()
    assert not seen and len(ev.waiting) == 2
    assert ev.drain(interrupted=lambda: False) == 0
    assert seen == [("epoch 1/3", 2.0), ("epoch 2/3", 10.0)]
    assert [(label, units) for label, units, _ in ev.completed()] == [
        ("epoch 1/3", 100),
        ("epoch 2/3", 200),
    ]
    assert ev.count == 2 and ev.cpu_seconds >= 0
    ev.close()


def test_an_evaluation_that_waited_long_enough_runs_beside_the_workers():
    seen = []
    ev = IdleEvaluations(recorder(seen), wait_seconds=0, runnable=busy(2), cores=2)
    ev.submit(model_with(1.0), "epoch 1/3", 100)  # wait_seconds=0: at once
    assert wait_until(lambda: ev.ready, timeout=30)
    assert seen == [("epoch 1/3", 2.0)]
    ev.close()


def test_a_full_queue_sends_the_oldest_at_once_and_keeps_the_order():
    seen = []
    ev = IdleEvaluations(recorder(seen), wait_seconds=60, runnable=busy(2), cores=2)
    n = idle_evaluation.MAX_PENDING + 2
    for i in range(n):
        ev.submit(model_with(float(i)), f"epoch {i + 1}", i)
    assert len(ev.waiting) == idle_evaluation.MAX_PENDING
    assert ev.drain(interrupted=lambda: False) == 0
    assert [label for label, _ in seen] == [f"epoch {i + 1}" for i in range(n)]
    ev.close()


def test_a_signal_during_the_drain_drops_what_has_not_started():
    seen, gate = [], threading.Event()
    ev = IdleEvaluations(recorder(seen, gate), wait_seconds=0, runnable=busy(2), cores=2)
    for i in range(3):  # the first goes to the thread at once and blocks there
        ev.submit(model_with(float(i)), f"epoch {i + 1}", i)
    assert wait_until(lambda: ev.busy, timeout=30) and len(ev.waiting) == 2
    threading.Timer(0.2, gate.set).start()  # the one the thread had started ends later
    assert ev.drain(interrupted=lambda: True) == 2
    assert not ev.busy and [label for label, _ in seen] == ["epoch 1"] and not ev.queue
    ev.close()


def test_an_evaluation_that_raises_hands_its_error_to_the_run_loop():
    def fails(model, label):
        raise ValueError("no test split")

    ev = IdleEvaluations(fails, wait_seconds=0, runnable=Cores(1), cores=2)
    ev.submit(model_with(1.0), "epoch 1/2", 10)
    assert wait_until(lambda: ev.ready, timeout=30)
    [(_, _, outcome)] = ev.completed()
    assert isinstance(outcome, ValueError)
    ev.close()


def test_a_model_too_large_to_copy_is_evaluated_in_place(monkeypatch):
    monkeypatch.setattr(idle_evaluation, "MAX_BYTES", 64)
    ev = IdleEvaluations(recorder([]), wait_seconds=0, runnable=Cores(1), cores=2)
    assert not ev.submit(torch.nn.Linear(10, 10), "epoch 1/2", 10)
    assert ev.thread is None  # nothing copied, no thread


def test_a_model_deepcopy_cannot_copy_is_evaluated_in_place():
    class Uncopyable(torch.nn.Linear):
        def __deepcopy__(self, memo):
            raise TypeError("holds a generator")

    ev = IdleEvaluations(recorder([]), wait_seconds=0, runnable=Cores(1), cores=2)
    assert not ev.submit(Uncopyable(2, 1), "epoch 1/2", 10)
    assert not ev.submit(Uncopyable(2, 1), "epoch 2/2", 20) and ev.thread is None


def test_the_snapshot_does_not_share_the_models_memory():
    model = model_with(1.0)
    model.share_memory()
    ev = IdleEvaluations(recorder([]), wait_seconds=60, runnable=busy(2), cores=2)
    ev.submit(model, "epoch 1/2", 10)
    assert not ev.model.weight.is_shared()
    assert ev.model.weight.data_ptr() != model.weight.data_ptr()
    ev.close()


@pytest.mark.skipif(runnable_threads() is None, reason="no /proc/loadavg here (not Linux)")
def test_the_kernels_runnable_count_includes_this_thread():
    assert runnable_threads() >= 1


def finishing(seen_interrupt=False):
    """A scheduler whose workers have exited, with three evaluations waiting (the first
    blocked in the thread until `gate` is set)."""
    import contextlib

    from hogwild.reporting.timeline import Timeline

    seen, gate = [], threading.Event()
    evaluator = SimpleNamespace(idle_cores=True, evaluate=recorder(seen, gate))
    scheduler = EvaluationScheduler(evaluator, model_with(0.0), Timeline(0.0), wait_seconds=0)
    idle = scheduler.idle = IdleEvaluations(
        evaluator.evaluate, wait_seconds=0, runnable=busy(2), cores=2
    )
    for i in range(3):
        idle.submit(model_with(float(i)), f"epoch {i + 1}/4", i)
    assert wait_until(lambda: idle.busy, timeout=30)
    threading.Timer(0.2, gate.set).start()
    return scheduler, seen, contextlib.nullcontext()


def test_after_the_workers_every_waiting_evaluation_runs_and_is_returned_in_order():
    scheduler, seen, every_core = finishing()
    drained = scheduler.drain(lambda: False, skip=False, every_core=every_core)
    assert [label for label, _ in seen] == ["epoch 1/4", "epoch 2/4", "epoch 3/4"]
    assert [units for units, _ in drained.scored] == [0, 1, 2] and drained.dropped == 0
    assert scheduler.timeline.phases["queued_evaluations"][2] == 1


def test_a_signal_during_the_drain_drops_those_not_started():
    scheduler, seen, every_core = finishing()
    drained = scheduler.drain(lambda: True, skip=False, every_core=every_core)
    assert [label for label, _ in seen] == ["epoch 1/4"] and drained.dropped == 2


def test_a_skipped_drain_runs_nothing_more_and_ends_the_thread():
    scheduler, seen, every_core = finishing()  # a second signal came before the drain
    drained = scheduler.drain(lambda: False, skip=True, every_core=every_core)
    assert [label for label, _ in seen] == ["epoch 1/4"]  # the one running ended first
    assert drained.dropped == 2 and not scheduler.idle.thread.is_alive()


def test_an_evaluation_that_raises_in_the_drain_is_returned_to_be_raised_by_the_loop():
    scheduler, _, every_core = finishing()

    def fails(model, label):
        raise ValueError("no test split")

    scheduler.idle.evaluate = fails  # the two still waiting raise
    drained = scheduler.drain(lambda: False, skip=False, every_core=every_core)
    outcomes = [outcome for _, outcome in drained.scored]
    assert isinstance(outcomes[-1], ValueError) and drained.dropped == 0
