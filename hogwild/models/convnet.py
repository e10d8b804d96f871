from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hogwild.errors import ConfigError


class ConvNet(nn.Module):
    """The classic MNIST Hogwild net: conv 1->10 k5, conv 10->20 k5 + dropout, fc 320->50->10."""

    def __init__(self, input_shape: Sequence[int], num_classes: int = 10, dropout: float = 0.5):
        super().__init__()
        if tuple(input_shape) != (1, 28, 28):
            raise ConfigError(
                f"model=convnet needs 1x28x28 inputs but the data gives {'x'.join(map(str, input_shape))}: "
                "use data=mnist or data=synthetic, or model=mlp"
            )
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d(dropout)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, num_classes)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.fc2(x)
