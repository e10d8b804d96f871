"""A model of your own, used through YAML only (see configs/model/wide_mlp.yaml beside this).

hogwild passes every model `input_shape` and `num_classes` from the data; the rest comes from
the YAML file.
"""

import math

from torch import nn


class WideMLP(nn.Module):
    def __init__(self, input_shape, num_classes, width: int = 512, dropout: float = 0.1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(input_shape), width),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(width, num_classes),
        )

    def forward(self, x):
        return self.net(x)
