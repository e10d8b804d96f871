"""Models, picked in YAML by `_target_`. They know nothing of processes.

Every model takes `input_shape` and `num_classes` (filled in from the data by the builder; for
an environment, the observation shape and the number of actions).
"""

from hogwild.models.actor_critic import ActorCritic
from hogwild.models.convnet import ConvNet
from hogwild.models.mf import MatrixFactorization
from hogwild.models.mlp import MLP
from hogwild.models.sparse_linear import SparseLinear

__all__ = ["ActorCritic", "MLP", "ConvNet", "MatrixFactorization", "SparseLinear"]
