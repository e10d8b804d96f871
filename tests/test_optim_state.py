"""Shared optimizer state: built eagerly, shared, adopted by every worker's optimizer."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import SMALL, read_summary, run_cli
from test_config import run_config

from hogwild import optim_state
from hogwild.config import ConfigError

FACTORIES = {
    "sgd-momentum": functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
    "adam": functools.partial(torch.optim.Adam, lr=0.01),
    "adamw-decay": functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.5),
    "rmsprop": functools.partial(torch.optim.RMSprop, lr=0.01),
    "adagrad": functools.partial(torch.optim.Adagrad, lr=0.01, initial_accumulator_value=0.1),
}


def params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return list(torch.nn.Linear(4, 3).parameters())


@pytest.mark.parametrize("name", FACTORIES)
def test_build_makes_a_fresh_state_without_moving_the_weights(name):
    ps = params()
    before = [p.detach().clone() for p in ps]
    states = optim_state.build(FACTORIES[name], ps)
    assert len(states) == len(ps) and all(states)
    assert all(torch.equal(b, p) for b, p in zip(before, ps))  # weight decay ran on clones only
    for state in states:
        for key, t in state.items():
            expected = 0.1 if (name, key) == ("adagrad", "sum") else 0.0
            assert torch.all(t == expected), (key, t)


@pytest.mark.parametrize("name", FACTORIES)
def test_two_optimizers_on_one_shared_state_see_each_others_updates(name):
    ps = params()
    states = optim_state.share(optim_state.build(FACTORIES[name], ps))
    assert all(t.is_shared() for t in optim_state.tensors(states))
    first, second = FACTORIES[name](ps), FACTORIES[name](ps)
    optim_state.attach(first, ps, states)
    optim_state.attach(second, ps, states)
    for p in ps:
        p.grad = torch.ones_like(p)
    first.step()
    seen = {k: v.clone() for k, v in second.state[ps[0]].items()}
    assert any(torch.any(v != (0.1 if k == "sum" else 0.0)) for k, v in seen.items())  # first's step is visible
    second.step()
    if "step" in states[0]:
        assert optim_state.steps(states) == 2  # one counter, advanced by both


def test_an_optimizer_without_state_is_refused():
    with pytest.raises(ConfigError, match="optimizer.shared=true: SGD keeps no per-parameter state"):
        optim_state.build(functools.partial(torch.optim.SGD, lr=0.1), params())


def test_shared_must_be_a_boolean():
    with pytest.raises(ConfigError, match="optimizer.shared='sometimes'.*true or false"):
        run_config(["optimizer.shared=sometimes"])
    assert run_config(["optimizer=adam", "optimizer.shared=true"]).shared_optimizer is True
    assert "shared" not in run_config(["optimizer=adam", "optimizer.shared=true"]).optimizer


def test_workers_update_one_shared_adam_state(tmp_path):
    """The orchestrator's copy of the state counts the steps of every worker, not of one."""
    run_dir = tmp_path / "run"
    result = run_cli([*SMALL, "optimizer=adam", "optimizer.shared=true", "trainer.start_method=fork"], run_dir)
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)
    per_worker = [w["steps"] for w in s["staleness"]["per_worker"]]
    assert s["optimizer_shared"] is True and len(per_worker) == 2
    # concurrent `step += 1` can race, so a few increments may be lost; never a per-worker count
    assert max(per_worker) < s["optimizer_state_steps"] <= sum(per_worker)
    assert s["test_accuracy"] > 0.8


def test_per_worker_state_is_the_default(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli([*SMALL, "optimizer=adam", "trainer.start_method=fork"], run_dir)
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)
    assert s["optimizer_shared"] is False and s["optimizer_state_steps"] is None


def test_an_optimizer_for_sparse_gradients_is_built_and_judged_like_the_others():
    """SparseAdam refuses dense gradients, so it gets sparse zeros; its step is a plain int,
    which cannot be shared: a clear refusal, not a traceback."""
    table = torch.nn.Embedding(10, 3, sparse=True)
    with pytest.raises(ConfigError, match="SparseAdam keeps step as plain Python values"):
        optim_state.build(functools.partial(torch.optim.SparseAdam, lr=0.01), list(table.parameters()))
