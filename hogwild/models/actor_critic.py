from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


def _mlp(sizes: Sequence[int], out: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.Tanh()]
    layers.append(nn.Linear(sizes[-1], out))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Two MLPs on the observation: the policy's logits (one per action) and the state's value.

    Separate bodies rather than one shared trunk: on classic-control tasks the value loss, which
    is orders of magnitude larger than the policy loss early on, then cannot drown the policy's
    gradient. `num_classes` is the number of discrete actions (filled in from the environment).
    """

    def __init__(
        self, input_shape: Sequence[int], num_classes: int, hidden_sizes: Sequence[int] = (64, 64)
    ):
        super().__init__()
        sizes = [math.prod(input_shape), *hidden_sizes]
        self.policy = _mlp(sizes, num_classes)
        self.value = _mlp(sizes, 1)
        # small final policy layer: the first rollouts act close to uniformly (more exploration)
        with torch.no_grad():
            self.policy[-1].weight.mul_(0.01)

    def policy_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The logits alone: what acting needs (half the work of forward)."""
        return self.policy(x)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [batch, actions], values [batch])."""
        return self.policy(x), self.value(x).squeeze(-1)
