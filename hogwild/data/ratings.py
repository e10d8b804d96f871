"""Ratings data for matrix factorization: (user, item) -> rating triples.

    from hogwild.data import make_synthetic_ratings, load_movielens
    splits = make_synthetic_ratings(num_users=1000, num_items=2000, num_ratings=200_000)
    splits = load_movielens("data/movielens")   # MovieLens 100K, downloaded once with its MD5

Both return a regression DataSplits: x is int64 (N, 2) of (user, item) ids, y is the float32
rating, and `model_kwargs` carries num_users / num_items for `model=mf`.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from hogwild.data.base import DataError, DataSplits
from hogwild.data.download import from_mirrors

MOVIELENS_ZIP = "ml-100k.zip"
MOVIELENS_MD5 = "0e33842e24a9c977be4e0107933c0723"  # the archive GroupLens publishes
MOVIELENS_MIRRORS = ("https://files.grouplens.org/datasets/movielens",)
RATINGS_FILE = "ml-100k/u.data"  # user id \t item id \t rating \t timestamp, ids from 1


def _splits(
    users, items, ratings, num_test: int, seed: int, name: str, num_users: int, num_items: int
) -> DataSplits:
    order = torch.randperm(len(ratings), generator=torch.Generator().manual_seed(seed))
    x = torch.stack([torch.as_tensor(users), torch.as_tensor(items)], dim=1).long()[order]
    y = torch.as_tensor(ratings, dtype=torch.float32)[order]
    return DataSplits(
        x[num_test:],
        y[num_test:],
        x[:num_test],
        y[:num_test],
        num_classes=0,
        name=name,
        task="regression",
        model_kwargs={"num_users": num_users, "num_items": num_items},
    )


def make_synthetic_ratings(
    num_users: int = 1000,
    num_items: int = 2000,
    num_ratings: int = 200_000,
    num_test_ratings: int = 20_000,
    rank: int = 8,
    noise: float = 0.25,
    seed: int = 0,
) -> DataSplits:
    """A rank-`rank` ratings matrix (plus user and item biases) around 3.5, observed at random
    (user, item) pairs with Gaussian noise of std `noise`: a model of that rank can reach an
    RMSE near `noise`, and predicting the mean gives about 1.0."""
    for key, value, least in (
        ("num_users", num_users, 1),
        ("num_items", num_items, 1),
        ("rank", rank, 1),
        ("num_ratings", num_ratings, 1),
        ("num_test_ratings", num_test_ratings, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise DataError(f"data.{key}={value!r}: must be an integer >= {least}")
    if not isinstance(noise, (int, float)) or noise < 0:
        raise DataError(f"data.noise={noise!r}: must be a number >= 0")
    rng = np.random.default_rng(seed)
    s = (0.36 / rank) ** 0.25  # factors of this std give a dot product of std 0.6
    u, v = rng.normal(0, s, (num_users, rank)), rng.normal(0, s, (num_items, rank))
    bu, bi = rng.normal(0, 0.35, num_users), rng.normal(0, 0.35, num_items)
    total = num_ratings + num_test_ratings
    users, items = rng.integers(0, num_users, total), rng.integers(0, num_items, total)
    r = (
        3.5
        + bu[users]
        + bi[items]
        + np.einsum("nk,nk->n", u[users], v[items])
        + rng.normal(0, noise, total)
    )
    return _splits(
        users, items, r, num_test_ratings, seed, "synthetic_ratings", num_users, num_items
    )


def download_movielens(root: Path, mirrors: Sequence[str], timeout: float, md5: str | None) -> None:
    if reasons := from_mirrors(MOVIELENS_ZIP, root, mirrors, md5, timeout):
        raise DataError(
            f"MovieLens 100K is missing from {root} and download failed ({'; '.join(reasons)}): "
            f"put {MOVIELENS_ZIP} (or its {RATINGS_FILE}) there, or check the network / data.mirrors"
        )


def _read_u_data(text: str, source: str) -> np.ndarray:
    try:
        table = np.loadtxt(text.splitlines(), dtype=np.int64, usecols=(0, 1, 2), ndmin=2)
    except ValueError as e:
        raise DataError(
            f"{source} is not MovieLens u.data (user \\t item \\t rating \\t time): {e}"
        ) from None
    if (
        len(table) == 0
        or table[:, :2].min() < 1
        or not ((table[:, 2] >= 1) & (table[:, 2] <= 5)).all()
    ):
        raise DataError(f"{source}: ids must start at 1 and ratings lie in 1..5")
    return table


def load_movielens(
    root: str | os.PathLike = "data/movielens",
    download: bool = True,
    mirrors: Sequence[str] = MOVIELENS_MIRRORS,
    timeout: float = 30.0,
    md5: str | None = MOVIELENS_MD5,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> DataSplits:
    """MovieLens 100K from `root`: an extracted `ml-100k/u.data`, else `ml-100k.zip` (downloaded
    with its MD5 when absent). A seeded random `test_fraction` of the ratings is the test split."""
    if isinstance(mirrors, str):
        mirrors = [mirrors]
    if not 0 < test_fraction < 1:
        raise DataError(f"data.test_fraction={test_fraction!r}: must lie strictly between 0 and 1")
    root = Path(root).expanduser().absolute()
    extracted, archive = root / RATINGS_FILE, root / MOVIELENS_ZIP
    if not extracted.is_file() and not archive.is_file():
        if not download:
            raise DataError(
                f"MovieLens 100K is missing from {root}: put {MOVIELENS_ZIP} or {RATINGS_FILE} there, "
                "or set data.download=true"
            )
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DataError(
                f"cannot create {root} ({e.strerror or e}): set data.root to a writable folder"
            ) from None
        download_movielens(root, mirrors, timeout, md5)
    if extracted.is_file():
        table = _read_u_data(extracted.read_text(), str(extracted))
    else:
        try:
            with zipfile.ZipFile(archive) as z:
                table = _read_u_data(z.read(RATINGS_FILE).decode(), f"{archive}:{RATINGS_FILE}")
        except (zipfile.BadZipFile, KeyError) as e:
            raise DataError(
                f"{archive} is not the MovieLens 100K archive ({e}): delete it to download it again"
            ) from None
    users, items = table[:, 0] - 1, table[:, 1] - 1
    num_test = max(1, int(round(test_fraction * len(table))))
    return _splits(
        users,
        items,
        table[:, 2].astype(np.float32),
        num_test,
        seed,
        "movielens",
        int(users.max()) + 1,
        int(items.max()) + 1,
    )
