"""Matrix factorization with sparse embeddings: Hogwild's home ground.

rating(u, i) = global bias + b_u + b_i + <p_u, q_i>. The four tables are nn.Embedding with
sparse=True, so a step's gradient is a sparse tensor over the rows of its batch, and SGD (or
SparseAdam, Adagrad) updates those rows of the shared tables only: two workers rarely touch the
same rows, and a step costs the same whatever the table size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hogwild.errors import ConfigError
from hogwild.models import init


class MatrixFactorization(nn.Module):
    def __init__(
        self,
        num_users: int | None = None,
        num_items: int | None = None,
        dim: int = 32,
        sparse: bool = True,
        init_std: float = 0.1,
        input_shape: Sequence[int] | None = None,
        num_classes: int | None = None,
    ):
        super().__init__()
        if num_users is None or num_items is None:
            raise ConfigError(
                "model=mf needs a ratings data set that names its users and items: "
                "use data=synthetic_ratings or data=movielens"
            )
        # each table made and initialised once: nn.Embedding's own N(0, 1) init would first
        # fill it for nothing (seconds for a table of GiBs)
        self.user = self._table(num_users, dim, sparse, init_std)
        self.item = self._table(num_items, dim, sparse, init_std)
        self.user_bias = self._table(num_users, 1, sparse, None)
        self.item_bias = self._table(num_items, 1, sparse, None)
        self.bias = nn.Parameter(torch.tensor(3.5))  # dense, one scalar: the global mean rating

    @staticmethod
    def _table(rows: int, dim: int, sparse: bool, std: float | None) -> nn.Embedding:
        """N(0, std) factors, or zeros (std None)."""
        weight = (
            torch.zeros(rows, dim)
            if std is None
            else init.normal_(torch.empty(rows, dim), 0.0, std)
        )
        return nn.Embedding(rows, dim, sparse=sparse, _weight=weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, i = x[:, 0], x[:, 1]
        dot = (self.user(u) * self.item(i)).sum(1)
        return self.bias + self.user_bias(u).squeeze(1) + self.item_bias(i).squeeze(1) + dot
