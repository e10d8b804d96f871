"""The data layer: loaders that return a DataSplits of four tensors, in memory or mapped.

    from hogwild.data import load_digits, load_mnist, make_synthetic
    splits = make_synthetic(num_samples=1000, seed=0)
    splits = make_synthetic(num_samples=10**7, cache_dir="/data/cache")   # written once, mapped

Loaders know nothing of processes, Hydra or the trainer. Every user-facing problem
(missing files, bad argument values) is raised as a DataError with a one-line message.
"""

from hogwild.data.base import DataError, DataSplits
from hogwild.data.digits import load_digits
from hogwild.data.mapped import load_mapped, write_mapped
from hogwild.data.mnist import load_mnist
from hogwild.data.ratings import load_movielens, make_synthetic_ratings
from hogwild.data.sparse import load_libsvm, make_synthetic_sparse
from hogwild.data.synthetic import make_synthetic

__all__ = [
    "DataError",
    "DataSplits",
    "load_digits",
    "load_libsvm",
    "load_mapped",
    "load_mnist",
    "load_movielens",
    "make_synthetic",
    "make_synthetic_ratings",
    "make_synthetic_sparse",
    "write_mapped",
]
