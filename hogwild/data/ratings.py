"""Ratings data for matrix factorization: (user, item) -> rating triples.

    from hogwild.data import make_synthetic_ratings, load_movielens
    splits = make_synthetic_ratings(num_users=1000, num_items=2000, num_ratings=200_000)
    splits = load_movielens("data/movielens")   # MovieLens 100K, downloaded once with its MD5

Both return a regression DataSplits: x is int64 (N, 2) of (user, item) ids, y is the float32
rating, and `model_kwargs` carries num_users / num_items for `model=mf`. With `cache_dir=...`
both write their set there once (synthetic ratings in bounded chunks, at any size) and map it
(hogwild.data.mapped): data bigger than memory.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hogwild.data.base import DataError, DataSplits, make_folder
from hogwild.data.download import from_mirrors
from hogwild.data.mapped import MappedWriter, cached, write_splits
from hogwild.models import init

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


RATINGS_CHUNK = 1 << 20  # ratings drawn per call: bounds the generator's temporaries (~100 MB)


@dataclass(frozen=True)
class _Truth:
    """The true ratings matrix, as factors: a rank-`rank` product plus user and item biases."""

    u: np.ndarray
    v: np.ndarray
    bu: np.ndarray
    bi: np.ndarray
    noise: float

    def draw(self, n: int, seed: int, stream: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """n observed ratings, RATINGS_CHUNK at a time: chunk c of `stream` comes from its own
        generator (seed, stream, c), so that the rows do not depend on how many are drawn."""
        for c, lo in enumerate(range(0, n, RATINGS_CHUNK)):
            rng, k = np.random.default_rng([seed, stream, c]), min(RATINGS_CHUNK, n - lo)
            users, items = rng.integers(0, len(self.u), k), rng.integers(0, len(self.v), k)
            r = np.einsum("nk,nk->n", self.u.take(users, 0), self.v.take(items, 0))
            r = r.astype(np.float64)
            r += 3.5 + self.bu[users] + self.bi[items] + rng.normal(0, self.noise, k)
            yield np.stack([users, items], 1), r.astype(np.float32)


def _normal(g: torch.Generator, shape, std: float) -> np.ndarray:
    """N(0, std) float32 factors, from torch's generator: about three times as fast as NumPy's
    here, and a big table on every core (hogwild.models.init, chunks seeded from `g`)."""
    return init.normal_(torch.empty(shape), 0.0, std, generator=g).numpy()


def make_synthetic_ratings(
    num_users: int = 1000,
    num_items: int = 2000,
    num_ratings: int = 200_000,
    num_test_ratings: int = 20_000,
    rank: int = 8,
    noise: float = 0.25,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> DataSplits:
    """A rank-`rank` ratings matrix (plus user and item biases) around 3.5, observed at random
    (user, item) pairs with Gaussian noise of std `noise`: a model of that rank can reach an
    RMSE near `noise`, and predicting the mean gives about 1.0. The rows are drawn a chunk at a
    time (and i.i.d., so train and test are simply separate draws). With `cache_dir`, they are
    written there in those chunks, once, and mapped (hogwild.data.mapped): the same values,
    never whole in memory."""
    for key, value, least in (
        ("num_users", num_users, 1),
        ("num_items", num_items, 1),
        ("rank", rank, 1),
        ("num_ratings", num_ratings, 1),
        ("num_test_ratings", num_test_ratings, 1),
        ("seed", seed, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise DataError(f"data.{key}={value!r}: must be an integer >= {least}")
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not noise >= 0:
        raise DataError(f"data.noise={noise!r}: must be a number >= 0")
    rng = torch.Generator().manual_seed(seed)
    s = (0.36 / rank) ** 0.25  # factors of this std give a dot product of std 0.6
    truth = _Truth(
        _normal(rng, (num_users, rank), s),
        _normal(rng, (num_items, rank), s),
        _normal(rng, num_users, 0.35),
        _normal(rng, num_items, 0.35),
        float(noise),
    )
    sizes = {"train": num_ratings, "test": num_test_ratings}
    kwargs = {"num_users": num_users, "num_items": num_items}
    name = "synthetic_ratings"

    def write(w: MappedWriter) -> None:
        for stream, (split, n) in enumerate(sizes.items(), 1):
            x, y = w.array(f"{split}_x", (n, 2), np.int64), w.array(f"{split}_y", (n,), np.float32)
            for xs, ys in truth.draw(n, seed, stream):
                x.write(xs)
                y.write(ys)
        w.finish(name, "regression", 0, kwargs)

    if cache_dir is not None:
        params = {**kwargs, "num_ratings": num_ratings, "num_test_ratings": num_test_ratings}
        params |= {"rank": rank, "noise": float(noise), "seed": seed}
        params["factors"] = 2  # 2: big tables of true factors drawn in seeded chunks
        return cached(cache_dir, name, params, write)
    out = []
    for stream, n in enumerate(sizes.values(), 1):
        x, y = np.empty((n, 2), np.int64), np.empty(n, np.float32)
        lo = 0
        for xs, ys in truth.draw(n, seed, stream):
            x[lo : lo + len(xs)], y[lo : lo + len(ys)] = xs, ys
            lo += len(xs)
        out += [torch.from_numpy(x), torch.from_numpy(y)]
    return DataSplits(*out, num_classes=0, name=name, task="regression", model_kwargs=kwargs)


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
    cache_dir: str | os.PathLike | None = None,
) -> DataSplits:
    """MovieLens 100K from `root`: an extracted `ml-100k/u.data`, else `ml-100k.zip` (downloaded
    with its MD5 when absent). A seeded random `test_fraction` of the ratings is the test split.
    With `cache_dir`, converted there once (hogwild.data.mapped) and mapped; a changed source
    file is converted again."""
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
        make_folder(root, "set data.root to a writable folder")
        download_movielens(root, mirrors, timeout, md5)

    def build() -> DataSplits:
        if extracted.is_file():
            table = _read_u_data(extracted.read_text(), str(extracted))
        else:
            try:
                with zipfile.ZipFile(archive) as z:
                    text = z.read(RATINGS_FILE).decode()
            except (zipfile.BadZipFile, KeyError) as e:
                raise DataError(
                    f"{archive} is not the MovieLens 100K archive ({e}): delete it to download it again"
                ) from None
            table = _read_u_data(text, f"{archive}:{RATINGS_FILE}")
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

    if cache_dir is None:
        return build()
    source = extracted if extracted.is_file() else archive
    stat = source.stat()  # a replaced file is another data set
    params = {"source": str(source), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    params |= {"test_fraction": float(test_fraction), "seed": seed}
    return cached(cache_dir, "movielens", params, lambda w: write_splits(w, build()))
