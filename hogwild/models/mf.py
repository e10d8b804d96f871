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
        self.user = nn.Embedding(num_users, dim, sparse=sparse)
        self.item = nn.Embedding(num_items, dim, sparse=sparse)
        self.user_bias = nn.Embedding(num_users, 1, sparse=sparse)
        self.item_bias = nn.Embedding(num_items, 1, sparse=sparse)
        self.bias = nn.Parameter(torch.tensor(3.5))  # dense, one scalar: the global mean rating
        for table in (self.user, self.item):
            init.normal_(table.weight, 0.0, init_std)
        for table in (self.user_bias, self.item_bias):
            nn.init.zeros_(table.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, i = x[:, 0], x[:, 1]
        dot = (self.user(u) * self.item(i)).sum(1)
        return self.bias + self.user_bias(u).squeeze(1) + self.item_bias(i).squeeze(1) + dot
