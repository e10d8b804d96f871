"""A seeded, learnable stand-in for a real data set, generated in memory in a fraction of a second.

    from hogwild.data import make_synthetic
    splits = make_synthetic(num_samples=60000, input_shape=(1, 28, 28), num_classes=10, seed=0)

Each class c has a fixed random prototype p_c in input space (one N(0, 1) value per
element); a sample of class c is p_c plus N(0, noise^2) per element, rescaled by
1 / sqrt(1 + noise^2) so that every input element has unit variance, as a normalised
real data set would. Classes are balanced and shuffled.

How hard it is: two prototypes lie about sqrt(2 * D) apart (D = number of input elements),
so the best possible classifier errs between a pair with probability about
Phi(-sqrt(D / 2) / noise). With the defaults (noise=7.0, D=784, 10 classes) a
nearest-class-mean classifier scores about 98% and an MLP 784-256-10 about 97.5% after one
epoch of SGD (it then overfits a little): learnable, but not trivially 100%. For the same
noise, smaller inputs are harder and larger ones easier; for tiny inputs pass a smaller
noise (noise=2.0 at D=64 gives about 97%).

Prototypes, training set and test set come from three generators derived from `seed`, so
the same seed gives the same data, and train and test are independent draws from the same
distribution. `root` and `download` are accepted and ignored so that config overrides
meant for the real data sets do not break this one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch

from hogwild.data.base import DataError, DataSplits

# Rows per chunk: bounds the gathered-prototype temporary (13 MB at D=784) while keeping the
# number of Python-level calls negligible.
_CHUNK = 4096


def _check_int(key: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"data.{key}={value!r}: must be an integer >= {minimum}")
    return value


def _draw(
    prototypes: torch.Tensor, n: int, noise: float, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    num_classes, dim = prototypes.shape
    # Balanced labels (class counts differ by at most one), in random order.
    y = (torch.arange(n) % num_classes)[torch.randperm(n, generator=g)]
    x = torch.empty(n, dim)
    # Rescale prototypes and noise up front rather than the samples afterwards: one pass less.
    scale = 1.0 / math.sqrt(1.0 + noise * noise)
    prototypes = prototypes * scale
    # Fill in place chunk by chunk, so that no second full-size temporary is ever allocated.
    for start in range(0, n, _CHUNK):
        rows = x[start : start + _CHUNK]
        rows.normal_(0.0, noise * scale, generator=g)
        rows.add_(prototypes[y[start : start + _CHUNK]])
    return x, y


def make_synthetic(
    num_samples: int = 60000,
    num_test_samples: int = 10000,
    input_shape: Sequence[int] = (1, 28, 28),
    num_classes: int = 10,
    noise: float = 7.0,
    seed: int = 0,
    root: str | os.PathLike | None = None,
    download: bool | None = None,
) -> DataSplits:
    _check_int("num_samples", num_samples, 1)
    _check_int("num_test_samples", num_test_samples, 1)
    _check_int("num_classes", num_classes, 2)
    shape_ok = (
        isinstance(input_shape, Sequence)
        and not isinstance(input_shape, (str, bytes))
        and len(input_shape) > 0
    )
    if not shape_ok or any(
        isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in input_shape
    ):
        raise DataError(
            f"data.input_shape={input_shape!r}: must be a non-empty list of integers >= 1, e.g. [1, 28, 28]"
        )
    if (
        isinstance(noise, bool)
        or not isinstance(noise, (int, float))
        or not noise >= 0
        or math.isinf(noise)
    ):
        raise DataError(f"data.noise={noise!r}: must be a finite number >= 0")
    shape = tuple(int(d) for d in input_shape)  # Hydra hands over a ListConfig; store plain ints.

    # Three independent streams from one seed; drawing their seeds from a master generator
    # (rather than using seed, seed+1, ...) keeps seed=0's test set from being seed=1's train set.
    master = torch.Generator().manual_seed(seed)
    proto_seed, train_seed, test_seed = torch.randint(2**62, (3,), generator=master).tolist()

    dim = math.prod(shape)
    prototypes = torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(proto_seed))
    train_x, train_y = _draw(
        prototypes, num_samples, float(noise), torch.Generator().manual_seed(train_seed)
    )
    test_x, test_y = _draw(
        prototypes, num_test_samples, float(noise), torch.Generator().manual_seed(test_seed)
    )

    return DataSplits(
        train_x=train_x.view(num_samples, *shape),
        train_y=train_y,
        test_x=test_x.view(num_test_samples, *shape),
        test_y=test_y,
        num_classes=num_classes,
        name="synthetic",
    )
