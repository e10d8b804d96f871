"""Row-wise Adagrad: one accumulator per row of an embedding table, shared lock-free.

torch's Adagrad keeps a sum of squared gradients as big as the parameter: a 3 GiB table costs
3 GiB more per worker (or once, shared). Row-wise Adagrad (PyTorch-BigGraph's, FBGEMM's) keeps
one number per row: sum[r] += mean(g[r]^2), then row r -= lr * g[r] / (sqrt(sum[r]) + eps). The
columns of one row (one user's factors) share a step size, which is what their gradients have in
common anyway. A parameter of 0 or 1 dims keeps the element-wise accumulator, and a table of one
column (a bias table) gets exactly torch's Adagrad.

A sparse gradient (nn.Embedding(sparse=True)) is coalesced (repeated rows summed, as the dense
gradient would be) and updates only its rows with index ops: a step costs the same whatever the
table size, and gives what the same gradient given dense gives. Parameters and state are updated
in place, so workers that adopt one shared state (hogwild.optim.shared_state) all read and write
it, lock-free, like the parameters. `initial_state` says the state for a parameter without
building an optimizer or touching the parameter: the shared state costs one float per row, not a
copy of the model.
"""

from __future__ import annotations

import torch


class RowwiseAdagrad(torch.optim.Optimizer):
    """Adagrad with one accumulator per row for parameters of 2+ dims (embedding tables).

    `weight_decay` adds weight_decay * w to the gradient; a sparse gradient decays only the rows
    it touches (lazily, as FBGEMM does: a step never visits the whole table)."""

    def __init__(
        self,
        params,
        lr: float = 0.01,
        eps: float = 1e-10,
        initial_accumulator_value: float = 0.0,
        weight_decay: float = 0.0,
    ):
        # every argument is checked before Optimizer.__init__, which refuses an empty list last
        for name, value in (
            ("lr", lr),
            ("eps", eps),
            ("initial_accumulator_value", initial_accumulator_value),
            ("weight_decay", weight_decay),
        ):
            if not value >= 0.0:
                raise ValueError(f"Invalid {name}: {value!r} (expected a number >= 0)")
        defaults = dict(
            lr=lr,
            eps=eps,
            initial_accumulator_value=initial_accumulator_value,
            weight_decay=weight_decay,
        )
        super().__init__(params, defaults)

    @classmethod
    def initial_state(
        cls, param: torch.Tensor, initial_accumulator_value: float = 0.0, **_options
    ) -> dict[str, torch.Tensor]:
        """The state of `param` before any step, from the constructor's keyword arguments: built
        directly (shared_state.build), so a shared state needs no copy of the parameters."""
        shape = param.shape[:1] if param.dim() > 1 else param.shape
        return {
            "step": torch.zeros((), dtype=torch.int64),
            "sum": torch.full(
                shape, float(initial_accumulator_value), dtype=param.dtype, device=param.device
            ),
        }

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:  # per worker: made at its first step (a shared one is attached)
                    state.update(self.initial_state(p, group["initial_accumulator_value"]))
                state["step"] += 1
                update(p, p.grad, state["sum"], group["lr"], group["eps"], group["weight_decay"])
        return loss


def update(
    param: torch.Tensor,
    grad: torch.Tensor,
    total: torch.Tensor,
    lr: float,
    eps: float,
    weight_decay: float = 0.0,
) -> None:
    """One row-wise Adagrad update of `param` and its accumulator `total`, in place."""
    rowwise = param.dim() > 1
    if grad.is_sparse:
        if grad.sparse_dim() != 1:
            raise ValueError(
                f"RowwiseAdagrad takes sparse gradients over rows (sparse_dim 1, as "
                f"nn.Embedding gives), got sparse_dim {grad.sparse_dim()}"
            )
        grad = grad.coalesce()
        rows, g = grad.indices()[0], grad.values()
        if weight_decay:
            g = g.add(param.index_select(0, rows), alpha=weight_decay)
        square = g.square()
        if rowwise:
            square = square.flatten(1).mean(1)
        total.index_add_(0, rows, square)
        std = total.index_select(0, rows).sqrt_().add_(eps)
        param.index_add_(0, rows, g / _per_row(std, param), alpha=-lr)
        return
    g = grad.add(param, alpha=weight_decay) if weight_decay else grad
    square = g.square()
    if rowwise:
        square = square.flatten(1).mean(1)
    total.add_(square)
    std = total.sqrt().add_(eps)
    param.add_(g / _per_row(std, param), alpha=-lr)


def _per_row(std: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """One value per row, broadcast over the row's other dims."""
    return std.view(-1, *([1] * (param.dim() - 1))) if param.dim() > 1 else std
