from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Module):
    """Flatten -> [Linear -> ReLU] * len(hidden_sizes) -> Linear. 784-256-10 on MNIST."""

    def __init__(
        self, input_shape: Sequence[int], num_classes: int, hidden_sizes: Sequence[int] = (256,)
    ):
        super().__init__()
        sizes = [math.prod(input_shape), *hidden_sizes]
        layers: list[nn.Module] = [nn.Flatten()]
        for fan_in, fan_out in zip(sizes, sizes[1:]):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        layers.append(nn.Linear(sizes[-1], num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
