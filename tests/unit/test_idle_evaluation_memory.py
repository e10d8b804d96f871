"""What the idle-core evaluations hold stays under `MAX_BYTES` whatever the model's size: the
snapshots and the thread's deepcopy, which copies tensors outside the state dict too."""

from __future__ import annotations

import torch

from hogwild.run import idle_evaluation
from hogwild.run.idle_evaluation import IdleEvaluations, held_bytes


def evaluate(model, label):
    return {}


def idle() -> IdleEvaluations:
    return IdleEvaluations(evaluate, wait_seconds=60, runnable=lambda: 1, cores=2)


class WithTable(torch.nn.Module):
    """A small state dict, and a large table outside it that deepcopy copies all the same."""

    def __init__(self, how: str):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(4))  # 16 bytes in the state dict
        table = torch.zeros(1 << 18)  # 1 MiB
        if how == "buffer":
            self.register_buffer("table", table, persistent=False)
        else:
            self.table = table


def test_tensors_outside_the_state_dict_count_against_the_budget(monkeypatch):
    monkeypatch.setattr(idle_evaluation, "MAX_BYTES", 512 << 10)  # room for the state dicts only
    for how in ("buffer", "attribute"):
        model = WithTable(how)
        assert held_bytes(model) == 16 + (1 << 20)
        ev = idle()
        assert not ev.submit(model, "epoch 1/2", 10)  # evaluated in place: nothing copied
        assert ev.model is None and ev.thread is None


def test_a_model_within_the_budget_is_copied_once_and_snapshot_per_evaluation(monkeypatch):
    monkeypatch.setattr(idle_evaluation, "MAX_BYTES", 4 << 20)
    model, ev = WithTable("buffer"), idle()
    try:
        assert ev.submit(model, "epoch 1/2", 10)
        assert ev.model is not None and ev.model.table.data_ptr() != model.table.data_ptr()
    finally:
        ev.close()


def test_shared_storages_count_once():
    lin = torch.nn.Linear(8, 8, bias=False)
    twice = torch.nn.Sequential(lin, lin)  # one weight, reached twice
    assert held_bytes(twice) == 8 * 8 * 4
