"""RowwiseAdagrad: the formula by hand, sparse == dense, and a shared state of one float per row."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.overrides import TorchFunctionMode

from hogwild.optim import RowwiseAdagrad, shared_state

from support import run_config

LR, EPS = 0.1, 1e-10


def table(rows: int = 6, cols: int = 3) -> torch.nn.Parameter:
    torch.manual_seed(0)
    return torch.nn.Parameter(torch.randn(rows, cols))


def by_hand(weights, total, grad, lr=LR, eps=EPS):
    """sum[r] += mean(g[r]^2); w[r] -= lr * g[r] / (sqrt(sum[r]) + eps), row by row."""
    weights, total = weights.clone(), total.clone()
    for r in range(weights.shape[0]):
        total[r] += float((grad[r] ** 2).mean())
        weights[r] -= lr * grad[r] / (total[r].sqrt() + eps)
    return weights, total


def sparse_grad(rows, values, shape) -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.tensor([rows]), values, shape, check_invariants=True)


def test_a_dense_step_follows_the_formula_row_by_row():
    p = table()
    opt = RowwiseAdagrad([p], lr=LR, initial_accumulator_value=0.5)
    weights, total = p.detach().clone(), torch.full((6,), 0.5)
    for seed in (1, 2):  # the second step divides by the sum of both
        torch.manual_seed(seed)
        grad = torch.randn(6, 3)
        p.grad = grad.clone()
        opt.step()
        weights, total = by_hand(weights, total, grad)
        torch.testing.assert_close(p.detach(), weights)
        torch.testing.assert_close(opt.state[p]["sum"], total)
    assert opt.state[p]["sum"].shape == (6,) and int(opt.state[p]["step"]) == 2


def test_a_sparse_step_updates_only_its_rows_by_the_formula():
    p = table()
    before = p.detach().clone()
    opt = RowwiseAdagrad([p], lr=LR)
    values = torch.randn(2, 3)
    p.grad = sparse_grad([4, 1], values, (6, 3))
    opt.step()
    dense = torch.zeros(6, 3)
    dense[4], dense[1] = values[0], values[1]
    weights, total = by_hand(before, torch.zeros(6), dense)
    torch.testing.assert_close(p.detach(), weights)
    torch.testing.assert_close(opt.state[p]["sum"], total)
    untouched = [0, 2, 3, 5]
    assert torch.equal(p.detach()[untouched], before[untouched])
    assert torch.all(opt.state[p]["sum"][untouched] == 0)


def test_repeated_rows_of_a_sparse_gradient_are_summed_first():
    """Two lookups of one row in a batch: one update with the summed gradient, as dense."""
    p = table()
    before = p.detach().clone()
    opt = RowwiseAdagrad([p], lr=LR)
    a, b, c = torch.randn(3, 3)
    p.grad = sparse_grad([2, 5, 2], torch.stack([a, b, c]), (6, 3))
    assert not p.grad.is_coalesced()
    opt.step()
    dense = torch.zeros(6, 3)
    dense[2], dense[5] = a + c, b
    weights, total = by_hand(before, torch.zeros(6), dense)
    torch.testing.assert_close(p.detach(), weights)
    torch.testing.assert_close(opt.state[p]["sum"], total)


def test_an_embedding_gives_the_same_result_with_sparse_and_dense_gradients():
    results = []
    for sparse in (True, False):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(20, 4, sparse=sparse)
        opt = RowwiseAdagrad(emb.parameters(), lr=LR, initial_accumulator_value=0.1)
        for step in range(3):
            torch.manual_seed(10 + step)
            idx = torch.randint(0, 20, (12,))  # repeats likely
            opt.zero_grad()
            (emb(idx) * torch.randn(12, 4)).sum().backward()
            assert emb.weight.grad.is_sparse == sparse
            opt.step()
        results.append((emb.weight.detach().clone(), opt.state[emb.weight]["sum"].clone()))
    (w_sparse, s_sparse), (w_dense, s_dense) = results
    torch.testing.assert_close(w_sparse, w_dense)
    torch.testing.assert_close(s_sparse, s_dense)


@pytest.mark.parametrize("shape", [(), (5,), (5, 1)])
def test_a_parameter_of_under_two_dims_or_one_column_gets_torchs_adagrad(shape):
    torch.manual_seed(0)
    ours, theirs = torch.nn.Parameter(torch.randn(shape)), torch.nn.Parameter(torch.randn(shape))
    with torch.no_grad():
        theirs.copy_(ours)
    a = RowwiseAdagrad([ours], lr=LR, initial_accumulator_value=0.2)
    b = torch.optim.Adagrad([theirs], lr=LR, initial_accumulator_value=0.2, eps=EPS)
    for _ in range(3):
        grad = torch.randn(shape)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        a.step()
        b.step()
    torch.testing.assert_close(ours.detach(), theirs.detach())
    torch.testing.assert_close(a.state[ours]["sum"].view(-1), b.state[theirs]["sum"].view(-1))


def test_weight_decay_decays_every_row_on_a_dense_step_and_only_touched_rows_on_a_sparse_one():
    p, q = table(), table()
    before = p.detach().clone()
    dense = RowwiseAdagrad([p], lr=LR, weight_decay=0.5)
    sparse = RowwiseAdagrad([q], lr=LR, weight_decay=0.5)
    grad = torch.zeros(6, 3)
    grad[3] = torch.randn(3)
    p.grad, q.grad = grad.clone(), sparse_grad([3], grad[3:4].clone(), (6, 3))
    dense.step()
    sparse.step()
    weights, _ = by_hand(before, torch.zeros(6), grad + 0.5 * before)
    torch.testing.assert_close(p.detach(), weights)
    torch.testing.assert_close(q.detach()[3], weights[3])
    assert torch.equal(q.detach()[[0, 1, 2, 4, 5]], before[[0, 1, 2, 4, 5]])


@pytest.mark.parametrize("key", ["lr", "eps", "initial_accumulator_value", "weight_decay"])
def test_bad_arguments_are_refused_before_the_parameter_list(key):
    with pytest.raises(ValueError, match=f"Invalid {key}: -1.0"):
        RowwiseAdagrad([], **{key: -1.0})
    with pytest.raises(ValueError, match=f"Invalid {key}: nan"):
        RowwiseAdagrad([table()], **{key: float("nan")})
    with pytest.raises(ValueError, match="empty parameter list"):  # the arguments passed
        RowwiseAdagrad([], **{key: 0.5})


class Touches(TorchFunctionMode):
    """Records every torch function called on `watched`."""

    def __init__(self, watched: torch.Tensor):
        super().__init__()
        self.watched, self.calls = watched, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if any(a is self.watched for a in args):
            self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_the_shared_state_is_built_from_shapes_alone_without_copying_the_parameters():
    p = table(1000, 8)
    before = p.detach().clone()
    factory = functools.partial(RowwiseAdagrad, lr=LR, initial_accumulator_value=0.3)
    with Touches(p) as seen:
        states = shared_state.build(factory, [p])
    assert set(seen.calls) <= {"__get__", "dim"}, seen.calls  # shape, dtype, device: no clone
    assert torch.equal(p.detach(), before)
    (state,) = states
    assert state["sum"].shape == (1000,) and torch.all(state["sum"] == 0.3)
    assert int(state["step"]) == 0


def test_the_built_state_is_the_one_a_worker_would_make_for_itself():
    p = torch.nn.Parameter(torch.zeros(7, 2, dtype=torch.float64))
    (built,) = shared_state.build(functools.partial(RowwiseAdagrad, lr=LR), [p])
    opt = RowwiseAdagrad([p], lr=LR)
    p.grad = torch.zeros_like(p)
    opt.step()
    own = opt.state[p]
    assert set(own) == set(built)
    for key in built:
        assert own[key].shape == built[key].shape and own[key].dtype == built[key].dtype, key
    assert torch.equal(own["sum"], built["sum"])


def test_two_workers_on_one_shared_state_see_each_others_rows():
    emb = torch.nn.Embedding(10, 4, sparse=True)
    params = list(emb.parameters())
    factory = functools.partial(RowwiseAdagrad, lr=LR)
    states = shared_state.share(shared_state.build(factory, params))
    assert all(t.is_shared() for t in shared_state.tensors(states))
    first, second = factory(params), factory(params)
    shared_state.attach(first, params, states)
    shared_state.attach(second, params, states)
    before = emb.weight.detach().clone()
    grad = torch.randn(1, 4)
    for opt in (first, second):
        opt.zero_grad()
        emb.weight.grad = sparse_grad([3], grad.clone(), (10, 4))
        opt.step()
    square = float((grad**2).mean())
    assert float(second.state[emb.weight]["sum"][3]) == pytest.approx(2 * square)
    # the second step divided by both workers' history, the one shared sum
    row = (
        before[3] - LR * grad[0] / (square**0.5 + EPS) - LR * grad[0] / ((2 * square) ** 0.5 + EPS)
    )
    torch.testing.assert_close(emb.weight.detach()[3], row)
    assert shared_state.steps(states) == 2


def test_the_shipped_option_shares_its_state_and_builds_the_optimizer():
    from hogwild.cli.builders import build_optimizer_factory

    run = run_config(["+experiment=matrix_factorization", "optimizer=rowwise_adagrad"])
    assert run.shared_optimizer is True
    factory = build_optimizer_factory(run.optimizer)
    assert isinstance(factory([table()]), RowwiseAdagrad)
