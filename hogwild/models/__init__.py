"""Models, picked in YAML by `_target_`. They know nothing of processes.

Every model takes `input_shape` and `num_classes` (filled in from the data by the builder).
"""

from hogwild.models.convnet import ConvNet
from hogwild.models.mf import MatrixFactorization
from hogwild.models.mlp import MLP
from hogwild.models.sparse_linear import SparseLinear

__all__ = ["MLP", "ConvNet", "MatrixFactorization", "SparseLinear"]
