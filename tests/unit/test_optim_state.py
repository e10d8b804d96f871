"""Shared optimizer state: built eagerly, shared, adopted by every worker's optimizer."""

from __future__ import annotations

import functools

import pytest
import torch

from hogwild.errors import ConfigError
from hogwild.optim import RowwiseAdagrad, shared_state

from support import run_config

FACTORIES = {
    "sgd-momentum": functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
    "adam": functools.partial(torch.optim.Adam, lr=0.01),
    "adamw-decay": functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.5),
    "rmsprop": functools.partial(torch.optim.RMSprop, lr=0.01),
    "adagrad": functools.partial(torch.optim.Adagrad, lr=0.01, initial_accumulator_value=0.1),
    "rowwise-adagrad": functools.partial(RowwiseAdagrad, lr=0.01, initial_accumulator_value=0.1),
}
STARTS_AT = {("adagrad", "sum"): 0.1, ("rowwise-adagrad", "sum"): 0.1}  # else zero


def params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return list(torch.nn.Linear(4, 3).parameters())


@pytest.mark.parametrize("name", FACTORIES)
def test_build_makes_a_fresh_state_without_moving_the_weights(name):
    ps = params()
    before = [p.detach().clone() for p in ps]
    states = shared_state.build(FACTORIES[name], ps)
    assert len(states) == len(ps) and all(states)
    assert all(torch.equal(b, p) for b, p in zip(before, ps))  # weight decay ran on clones only
    for state in states:
        for key, t in state.items():
            expected = STARTS_AT.get((name, key), 0.0)
            assert torch.all(t == expected), (key, t)


@pytest.mark.parametrize("name", FACTORIES)
def test_two_optimizers_on_one_shared_state_see_each_others_updates(name):
    ps = params()
    states = shared_state.share(shared_state.build(FACTORIES[name], ps))
    assert all(t.is_shared() for t in shared_state.tensors(states))
    first, second = FACTORIES[name](ps), FACTORIES[name](ps)
    shared_state.attach(first, ps, states)
    shared_state.attach(second, ps, states)
    for p in ps:
        p.grad = torch.ones_like(p)
    first.step()
    seen = {k: v.clone() for k, v in second.state[ps[0]].items()}
    assert any(
        torch.any(v != STARTS_AT.get((name, k), 0.0)) for k, v in seen.items()
    )  # first's step is visible
    second.step()
    if "step" in states[0]:
        assert shared_state.steps(states) == 2  # one counter, advanced by both


def test_an_optimizer_without_state_is_refused():
    with pytest.raises(
        ConfigError, match="optimizer.shared=true: SGD keeps no per-parameter state"
    ):
        shared_state.build(functools.partial(torch.optim.SGD, lr=0.1), params())


def test_shared_must_be_a_boolean():
    with pytest.raises(ConfigError, match="optimizer.shared='sometimes'.*true or false"):
        run_config(["optimizer.shared=sometimes"])
    assert run_config(["optimizer=adam", "optimizer.shared=true"]).shared_optimizer is True
    assert "shared" not in run_config(["optimizer=adam", "optimizer.shared=true"]).optimizer


def test_an_optimizer_for_sparse_gradients_is_built_and_judged_like_the_others():
    """SparseAdam refuses dense gradients, so it gets sparse zeros; its step is a plain int,
    which cannot be shared: a clear refusal, not a traceback."""
    table = torch.nn.Embedding(10, 3, sparse=True)
    with pytest.raises(ConfigError, match="SparseAdam keeps step as plain Python values"):
        shared_state.build(
            functools.partial(torch.optim.SparseAdam, lr=0.01), list(table.parameters())
        )


def test_restore_copies_a_saved_state_that_fits_and_names_one_that_does_not():
    adam = FACTORIES["adam"]
    saved = shared_state.build(adam, params())
    for state in saved:
        for t in state.values():
            t.fill_(3.0)
    fresh = shared_state.build(adam, params())
    assert shared_state.restore(fresh, saved) is None
    assert all(torch.all(t == 3.0) for state in fresh for t in state.values())
    momentum = shared_state.build(FACTORIES["sgd-momentum"], params())
    reason = shared_state.restore(momentum, saved)
    assert "momentum_buffer" in reason and "exp_avg" in reason
    assert all(torch.all(t == 0.0) for state in momentum for t in state.values())  # left fresh
    assert "2 parameters" in shared_state.restore(
        shared_state.build(adam, list(torch.nn.Linear(4, 3, bias=False).parameters())), saved
    )


def test_an_optimizer_that_says_its_state_gets_it_from_the_factorys_keywords():
    """No clone, no step: the class's initial_state, given what the factory would pass."""
    weight = torch.nn.Parameter(torch.ones(5, 4))
    (state,) = shared_state.build(
        functools.partial(RowwiseAdagrad, lr=0.5, initial_accumulator_value=0.25), [weight]
    )
    assert state["sum"].shape == (5,) and torch.all(state["sum"] == 0.25)
    assert torch.all(weight == 1.0)


def test_a_state_said_directly_is_judged_like_a_built_one():
    class Counting(torch.optim.SGD):
        @classmethod
        def initial_state(cls, param, **options):
            return {"count": 0}

    with pytest.raises(ConfigError, match="Counting keeps count as plain Python values"):
        shared_state.build(functools.partial(Counting, lr=0.1), params())
