"""MNIST from the four standard IDX files, downloaded once if they are missing.

    from hogwild.data import load_mnist
    splits = load_mnist("data/mnist")   # (60000, 1, 28, 28) train, (10000, 1, 28, 28) test

Where the files are looked for, in `root` and then in `root/MNIST/raw/` (torchvision's
layout, so an existing torchvision download can be reused), each plain or gzipped:

    train-images-idx3-ubyte[.gz]   train-labels-idx1-ubyte[.gz]
    t10k-images-idx3-ubyte[.gz]    t10k-labels-idx1-ubyte[.gz]

Files found locally are used as they are, without a checksum, so any IDX files of the
same layout work (Fashion-MNIST, or small hand-made files: the image size comes from the
header). Missing files are downloaded as `.gz` from `mirrors` in order (file:// URLs work
too) and each is checked against `checksums` (default: MNIST_MD5) before it is moved into
place, so an interrupted or corrupt download never sits under the final name. Offline, or
with download=False, the DataError says which files to put in which folder.

Pixels are scaled to [0, 1] and standardised with the usual MNIST mean 0.1307 and std 0.3081.
"""

from __future__ import annotations

import gzip
import logging
import math
import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from hogwild.data.base import DataError, DataSplits, make_folder
from hogwild.data.download import from_mirrors

log = logging.getLogger(__name__)

TRAIN_IMAGES = "train-images-idx3-ubyte"
TRAIN_LABELS = "train-labels-idx1-ubyte"
TEST_IMAGES = "t10k-images-idx3-ubyte"
TEST_LABELS = "t10k-labels-idx1-ubyte"
FILES = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)

# MD5s of the gzipped files (the same as torchvision's).
MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
DEFAULT_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

# IDX magic numbers: two zero bytes, a type byte (0x08 = unsigned byte), the number of dims.
IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801


def find_file(root: Path, name: str) -> Path | None:
    for folder in (root, root / "MNIST" / "raw"):
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def read_idx(path: Path, magic: int) -> np.ndarray:
    """The array stored in an IDX file (gzipped if its name ends in .gz); DataError if malformed."""

    def bad(why: str) -> DataError:
        return DataError(f"MNIST file {path} is malformed ({why}): delete or replace it")

    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise bad(f"not a valid gzip file: {e}") from None
    except OSError as e:
        raise DataError(
            f"MNIST file {path} cannot be read ({e.strerror or e}): check its permissions"
        ) from None

    if len(data) < 4:
        raise bad(f"only {len(data)} bytes long")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        raise bad(f"magic number 0x{found:08x}, expected 0x{magic:08x}")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise bad(f"header cut short at {len(data)} bytes")
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    if len(data) != header + math.prod(dims):
        raise bad(f"{len(data) - header} data bytes for dims {dims}, expected {math.prod(dims)}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def download_mnist(
    root: str | os.PathLike,
    names: Iterable[str] = FILES,
    mirrors: Sequence[str] = DEFAULT_MIRRORS,
    timeout: float = 30.0,
    checksums: Mapping[str, str] | None = None,
) -> None:
    """Download `<name>.gz` for each name into root, trying mirrors in order.

    checksums maps "<name>.gz" to its MD5 (default MNIST_MD5); a file it does not list is
    not checked. Raises DataError naming the files still missing if any name fails on
    every mirror.
    """
    checksums = MNIST_MD5 if checksums is None else checksums
    root = Path(root).absolute()
    names = list(names)
    made = [p for p in (root, *root.parents) if not p.exists()]  # removed again on a failure
    make_folder(root, "set data.root to a writable folder", what="MNIST folder ")
    log.debug("downloading MNIST to %s", root)

    missing: list[str] = []
    for i, name in enumerate(names):
        reasons = from_mirrors(
            f"{name}.gz", root, mirrors, checksums.get(f"{name}.gz"), timeout, label=name
        )
        if reasons:
            # Stop at the first file no mirror could deliver: offline, the others would only
            # add more timeouts before the same error.
            missing = names[i:]
            break
    if missing:
        for folder in made:  # the folders this call made, when nothing landed in them
            try:
                folder.rmdir()
            except OSError:
                break
        # The failing file's reasons, one per mirror: enough to tell "offline" from "404".
        reason = "; ".join(reasons) or "data.mirrors is empty"
        raise DataError(
            f"MNIST files missing from {root} and download failed ({reason}): "
            f"put {', '.join(n + '(.gz)' for n in missing)} there, or check the network / data.mirrors"
        )


def load_mnist(
    root: str | os.PathLike = "data/mnist",
    download: bool = True,
    mirrors: Sequence[str] = DEFAULT_MIRRORS,
    timeout: float = 30.0,
    checksums: Mapping[str, str] | None = None,
) -> DataSplits:
    if isinstance(mirrors, str):  # A single URL, e.g. from the command line data.mirrors=...
        mirrors = [mirrors]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise DataError(f"data.timeout={timeout!r}: must be a number of seconds > 0")
    root = Path(root).expanduser().absolute()
    missing = [name for name in FILES if find_file(root, name) is None]
    if missing:
        if not download:
            raise DataError(
                f"MNIST files missing from {root}: {', '.join(missing)}; "
                "data.download=false, so put them there (gzipped or not) or set data.download=true"
            )
        download_mnist(root, missing, mirrors, timeout, checksums)

    paths = {name: find_file(root, name) for name in FILES}
    arrays = {
        name: read_idx(path, LABELS_MAGIC if "labels" in name else IMAGES_MAGIC)
        for name, path in paths.items()
    }
    for images, labels in ((TRAIN_IMAGES, TRAIN_LABELS), (TEST_IMAGES, TEST_LABELS)):
        if len(arrays[images]) != len(arrays[labels]):
            raise DataError(
                f"MNIST files {paths[images]} and {paths[labels]} hold {len(arrays[images])} images but "
                f"{len(arrays[labels])} labels: replace them with a matching pair"
            )
        if len(arrays[labels]) and arrays[labels].max() > 9:
            raise DataError(
                f"MNIST file {paths[labels]} has label {arrays[labels].max()}: labels must be 0-9"
            )

    def images(name: str) -> torch.Tensor:
        # astype makes a writable float copy, so torch does not warn about the read-only buffer.
        x = torch.from_numpy(arrays[name].astype(np.float32)).unsqueeze(1)  # (N, 1, rows, cols)
        return x.div_(255.0).sub_(MNIST_MEAN).div_(MNIST_STD)

    def labels(name: str) -> torch.Tensor:
        return torch.from_numpy(arrays[name].astype(np.int64))

    return DataSplits(
        train_x=images(TRAIN_IMAGES),
        train_y=labels(TRAIN_LABELS),
        test_x=images(TEST_IMAGES),
        test_y=labels(TEST_LABELS),
        num_classes=10,
        name="mnist",
    )
