"""Sparse, high-dimensional classification data for linear models (RCV1-style).

    from hogwild.data import make_synthetic_sparse, load_libsvm
    splits = make_synthetic_sparse(num_features=100_000, density=2e-4)
    splits = load_libsvm("data/rcv1", train_file="rcv1_train.binary", test_file="rcv1_test.binary")

A sample is stored as a float32 (2, K) block: row 0 holds its feature indices, row 1 their
values, padded to the longest sample with index `num_features` and value 0 (a padding row the
model never learns). Indices are exact in float32 up to 2**24 features. `model=sparse_linear`
reads it with an EmbeddingBag(sparse=True): a step updates only the features of its batch.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from hogwild.data.base import DataError, DataSplits
from hogwild.data.mapped import MappedWriter, cached, write_splits

MAX_FEATURES = 2**24  # float32 holds every integer index below this exactly
LIBSVM_CHUNK = 8192  # samples parsed and packed at a time when a file is converted


def _pack(rows: list[tuple[np.ndarray, np.ndarray]], num_features: int, width: int) -> torch.Tensor:
    x = np.zeros((len(rows), 2, width), dtype=np.float32)
    x[:, 0, :] = num_features  # padding index
    for n, (idx, val) in enumerate(rows):
        x[n, 0, : len(idx)], x[n, 1, : len(idx)] = idx, val
    return torch.from_numpy(x)


def make_synthetic_sparse(
    num_features: int = 100_000,
    num_samples: int = 100_000,
    num_test_samples: int = 10_000,
    density: float = 2e-4,
    noise: float = 0.5,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> DataSplits:
    """Binary labels from a sparse linear rule: each sample has ~density x num_features active
    features (values 1/sqrt(nnz), like tf-idf rows of unit norm), drawn with a Zipf-like skew so
    a few features are common and most are rare; y = [x . w* + noise > 0]. With `cache_dir`,
    made in memory once, written there and mapped (hogwild.data.mapped)."""
    if (
        isinstance(num_features, bool)
        or not isinstance(num_features, int)
        or not 2 <= num_features < MAX_FEATURES
    ):
        raise DataError(
            f"data.num_features={num_features!r}: must be an integer in [2, {MAX_FEATURES})"
        )
    for key, value in (("num_samples", num_samples), ("num_test_samples", num_test_samples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataError(f"data.{key}={value!r}: must be an integer >= 1")
    if not isinstance(density, (int, float)) or not 0 < density <= 1:
        raise DataError(f"data.density={density!r}: must lie in (0, 1]")
    if cache_dir is not None:
        params = {"num_features": num_features, "num_samples": num_samples}
        params |= {"num_test_samples": num_test_samples, "density": density, "noise": noise}
        again = functools.partial(make_synthetic_sparse, **params, seed=seed)
        return cached(
            cache_dir,
            "synthetic_sparse",
            {**params, "seed": seed},
            lambda w: write_splits(w, again()),
        )
    rng = np.random.default_rng(seed)
    nnz = max(1, round(density * num_features))
    popularity = 1.0 / np.arange(1, num_features + 1) ** 0.8
    popularity /= popularity.sum()
    w = rng.normal(0, 1, num_features)
    total = num_samples + num_test_samples
    idx = np.sort(rng.choice(num_features, size=(total, nnz), p=popularity), axis=1)
    val = np.full((total, nnz), 1.0 / np.sqrt(nnz), dtype=np.float32)
    score = (w[idx] * val).sum(1)
    y = (score / score.std() + rng.normal(0, noise, total) > 0).astype(np.int64)
    x = torch.zeros(total, 2, nnz)
    x[:, 0], x[:, 1] = torch.from_numpy(idx.astype(np.float32)), torch.from_numpy(val)
    y = torch.from_numpy(y)
    return DataSplits(
        x[:num_samples],
        y[:num_samples],
        x[num_samples:],
        y[num_samples:],
        num_classes=2,
        name="synthetic_sparse",
        model_kwargs={"num_features": num_features},
    )


def _libsvm_rows(path: Path) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(label, indices from 0, values) per sample, one line at a time."""
    empty = True
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            parts = line.split("#", 1)[0].split()
            if not parts:
                continue
            try:
                pairs = [p.split(":", 1) for p in parts[1:]]
                idx = (
                    np.array([int(i) for i, _ in pairs], dtype=np.int64) - 1
                )  # LIBSVM indices start at 1
                val = np.array([float(v) for _, v in pairs], dtype=np.float32)
            except ValueError:
                raise DataError(
                    f"{path}:{line_no} is not LIBSVM format (label index:value ...)"
                ) from None
            if len(idx) and idx.min() < 0:
                raise DataError(f"{path}:{line_no}: feature indices start at 1")
            empty = False
            yield parts[0], idx, val
    if empty:
        raise DataError(f"{path} holds no samples")


def _read_libsvm(path: Path) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[str]]:
    rows, labels = [], []
    for label, idx, val in _libsvm_rows(path):
        labels.append(label)
        rows.append((idx, val))
    return rows, labels


def _classes(num_features: int | None, seen: int, labels: set[str]) -> tuple[int, dict[str, int]]:
    """The feature count (`num_features`, or what the files use) and the labels' codes."""
    num_features = num_features or seen
    if seen > num_features or not 0 < num_features < MAX_FEATURES:
        raise DataError(
            f"data.num_features={num_features}: the files use {seen} features (at most {MAX_FEATURES - 1})"
        )
    classes = sorted(labels, key=lambda s: float(s))
    return num_features, {c: n for n, c in enumerate(classes)}


def load_libsvm(
    root: str | os.PathLike = "data/libsvm",
    train_file: str = "train.svm",
    test_file: str = "test.svm",
    num_features: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> DataSplits:
    """Two LIBSVM-format files from `root` (e.g. RCV1's rcv1_train.binary / rcv1_test.binary).
    Labels are mapped to 0..C-1 in sorted order (so -1/+1 become 0/1); `num_features` defaults
    to the largest index seen. With `cache_dir`, converted there once, streaming (two passes
    over the files, LIBSVM_CHUNK samples in memory at a time), and mapped (hogwild.data.mapped);
    changed files are converted again."""
    root = Path(root).expanduser().absolute()
    paths = [root / train_file, root / test_file]
    if missing := [str(p) for p in paths if not p.is_file()]:
        raise DataError(
            f"LIBSVM files missing: {', '.join(missing)}: put them there or set data.root / "
            "data.train_file / data.test_file"
        )
    name = f"libsvm:{train_file}"
    if cache_dir is not None:
        params: dict[str, object] = {"num_features": num_features}
        for split, p in zip(("train", "test"), paths):
            stat = p.stat()  # a replaced file is another data set
            params[split] = {"path": str(p), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        return cached(
            cache_dir, "libsvm", params, lambda w: _convert_libsvm(w, paths, num_features, name)
        )
    (train, train_labels), (test, test_labels) = (_read_libsvm(p) for p in paths)
    seen = 1 + max((int(i.max()) for i, _ in train + test if len(i)), default=-1)
    num_features, code = _classes(num_features, seen, set(train_labels) | set(test_labels))
    width = max(1, max(len(i) for i, _ in train + test))
    return DataSplits(
        _pack(train, num_features, width),
        torch.tensor([code[c] for c in train_labels]),
        _pack(test, num_features, width),
        torch.tensor([code[c] for c in test_labels]),
        num_classes=max(2, len(code)),
        name=name,
        model_kwargs={"num_features": num_features},
    )


def _convert_libsvm(
    w: MappedWriter, paths: list[Path], num_features: int | None, name: str
) -> None:
    """load_libsvm's arrays, written as they are read: a pass for the shapes, one to write."""
    counts, seen, width, labels = [], 0, 1, set()
    for p in paths:
        n = 0
        for label, idx, _ in _libsvm_rows(p):
            n, width = n + 1, max(width, len(idx))
            seen = max(seen, 1 + int(idx.max()) if len(idx) else 0)
            labels.add(label)
        counts.append(n)
    num_features, code = _classes(num_features, seen, labels)
    for split, p, n in zip(("train", "test"), paths, counts):
        x = w.array(f"{split}_x", (n, 2, width), np.float32)
        y = w.array(f"{split}_y", (n,), np.int64)
        rows, codes = [], []
        for label, idx, val in _libsvm_rows(p):
            rows.append((idx, val))
            codes.append(code[label])
            if len(rows) == LIBSVM_CHUNK:
                x.write(_pack(rows, num_features, width))
                y.write(np.array(codes, dtype=np.int64))
                rows, codes = [], []
        if rows:
            x.write(_pack(rows, num_features, width))
            y.write(np.array(codes, dtype=np.int64))
    w.finish(name, "classification", max(2, len(code)), {"num_features": num_features})
