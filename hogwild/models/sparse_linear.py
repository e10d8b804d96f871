"""Logistic (softmax) regression over sparse high-dimensional features.

Reads hogwild.data.sparse's (2, K) blocks (feature indices, values) with an
EmbeddingBag(mode="sum", sparse=True): the gradient is a sparse tensor over the features of the
batch, so a step writes only those rows of the shared weight table and costs the same however
many features the model has.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hogwild.errors import ConfigError


class SparseLinear(nn.Module):
    def __init__(
        self,
        num_features: int | None = None,
        num_classes: int = 2,
        sparse: bool = True,
        input_shape: Sequence[int] | None = None,
    ):
        super().__init__()
        if num_features is None:
            raise ConfigError(
                "model=sparse_linear needs sparse feature data: use data=synthetic_sparse or data=libsvm"
            )
        # one extra row, the padding index: never read into a sum, never updated
        self.weight = nn.EmbeddingBag(
            num_features + 1, num_classes, mode="sum", sparse=sparse, padding_idx=num_features
        )
        nn.init.zeros_(self.weight.weight)
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight(x[:, 0].long(), per_sample_weights=x[:, 1]) + self.bias
