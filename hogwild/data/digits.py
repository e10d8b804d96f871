"""scikit-learn's bundled 8x8 handwritten digits: 1,797 images, 10 classes, no download.

    from hogwild.data import load_digits
    splits = load_digits(test_fraction=0.2, seed=0)
    splits.train_x.shape   # (1438, 1, 8, 8), float32, roughly zero mean / unit variance
    splits.test_x.shape    # (359, 1, 8, 8)

The split is stratified (each class keeps its share of the test set) and depends only on
`seed`. Pixels (0..16) are divided by 16 and then standardised with fixed constants of
the whole set, the same way MNIST uses 0.1307 / 0.3081, so an MLP 64-256-10 trained with
plain SGD (lr 0.05-0.1) reaches >= 0.95 test accuracy within a few epochs.

`root` and `download` are accepted and ignored: the data ships inside scikit-learn, and
taking them lets a config that sets `data.root` / `data.download` for every data set work.
"""

from __future__ import annotations

import gzip
import importlib.util
import os

import torch

from hogwild.data.base import DataError, DataSplits

# Mean and std of all 1,797 images after dividing by 16.
DIGITS_MEAN = 0.3053
DIGITS_STD = 0.3760


def read_arrays():
    """(pixels (N, 64), labels (N,)) as numpy arrays, from the CSV scikit-learn ships: read
    where it lies, without importing scikit-learn (about a second, most of the default run's
    data time); through scikit-learn's own loader if the file is not where it used to be."""
    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    folders = spec.submodule_search_locations if spec else None
    path = os.path.join(folders[0], "datasets", "data", "digits.csv.gz") if folders else ""
    if not os.path.isfile(path):
        from sklearn.datasets import load_digits as sk_load_digits

        bunch = sk_load_digits()
        return bunch.data, bunch.target
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    return table[:, :-1], table[:, -1].astype(np.int64)


def load_digits(
    test_fraction: float = 0.2,
    seed: int = 0,
    root: str | os.PathLike | None = None,
    download: bool | None = None,
) -> DataSplits:
    if (
        isinstance(test_fraction, bool)
        or not isinstance(test_fraction, (int, float))
        or not 0 < test_fraction < 1
    ):
        raise DataError(
            f"data.test_fraction={test_fraction!r}: must be a number strictly between 0 and 1"
        )

    images, target = read_arrays()
    x = torch.from_numpy(images).to(torch.float32).reshape(-1, 1, 8, 8)
    x = (x / 16.0 - DIGITS_MEAN) / DIGITS_STD
    y = torch.from_numpy(target).to(torch.int64)

    # Stratified split: shuffle each class on its own and send its first share to the test set.
    g = torch.Generator().manual_seed(seed)
    test_parts, train_parts = [], []
    for c in range(10):
        idx = torch.nonzero(y == c).squeeze(1)
        idx = idx[torch.randperm(len(idx), generator=g)]
        # At least one example of each class on either side, whatever the fraction.
        n_test = min(len(idx) - 1, max(1, round(test_fraction * len(idx))))
        test_parts.append(idx[:n_test])
        train_parts.append(idx[n_test:])
    # Shuffle once more so the classes are interleaved rather than in blocks.
    train_idx = torch.cat(train_parts)
    train_idx = train_idx[torch.randperm(len(train_idx), generator=g)]
    test_idx = torch.cat(test_parts)
    test_idx = test_idx[torch.randperm(len(test_idx), generator=g)]

    return DataSplits(
        train_x=x[train_idx].contiguous(),
        train_y=y[train_idx].contiguous(),
        test_x=x[test_idx].contiguous(),
        test_y=y[test_idx].contiguous(),
        num_classes=10,
        name="digits",
    )
