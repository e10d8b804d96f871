"""The supervised evaluator: every epoch but the last while the workers train, the last once
they have exited (on every core, unless workers are forked from this process)."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from hogwild.run import evaluation
from hogwild.workloads.device import Layout
from hogwild.workloads.supervised import SupervisedEvaluator


def evaluator(epochs=3):
    x, y = torch.randn(20, 4), torch.randint(0, 2, (20,))
    return SupervisedEvaluator(
        x, y, F.cross_entropy, False, torch.device("cpu"), Layout(), 8, epochs
    )


def test_the_last_epoch_waits_for_the_end_and_is_labelled_as_an_epoch(caplog):
    ev, model = evaluator(epochs=3), torch.nn.Linear(4, 2)
    assert ev.due(0, 0) is None  # the start
    assert ev.due(1, 100) == "epoch 1/3" and ev.due(1, 120) is None
    assert ev.due(2, 200) == "epoch 2/3"
    assert ev.due(3, 300) is None  # the last epoch: after the workers exit
    assert ev.needs_final(completed=True, weights_changed=False)
    with caplog.at_level(logging.INFO, logger="hogwild"):
        results = ev.evaluate(model, "final")
    assert "epoch 3/3: test loss" in caplog.text and set(results) == {"eval/loss", "eval/accuracy"}


def test_an_interrupted_run_is_evaluated_at_the_end_under_its_own_label(caplog):
    ev = evaluator(epochs=3)
    ev.due(0, 0)
    assert ev.due(1, 100) == "epoch 1/3"
    ev.evaluate(torch.nn.Linear(4, 2), "epoch 1/3")
    assert ev.needs_final(completed=False, weights_changed=False)  # trained on since
    with caplog.at_level(logging.INFO, logger="hogwild"):
        ev.evaluate(torch.nn.Linear(4, 2), "final")
    assert "final: test loss" in caplog.text


@pytest.fixture
def threads(monkeypatch):
    """torch.set_num_threads recorded, not applied: this process forks in other tests."""
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(evaluation, "usable_cores", lambda: 3)
    return calls


def test_the_final_evaluation_uses_every_core_unless_workers_fork_from_here(threads):
    with evaluation.every_core("fork", may_widen=True):
        pass
    assert threads == []
    with evaluation.every_core("forkserver", may_widen=False):  # a sweep, the Python API
        pass
    assert threads == []
    before = torch.get_num_threads()
    with evaluation.every_core("forkserver", may_widen=True):  # the CLI's one job
        assert threads == [3]
    assert threads == [3, before]
