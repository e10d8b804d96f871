"""Data sets bigger than memory: a folder of .npy files that every process maps, nothing copied.

    splits = make_synthetic_ratings(num_ratings=500_000_000, cache_dir="/data/cache")
    splits = load_mapped("/data/cache/synthetic_ratings-0f1e2d3c4b5a")   # a folder written before
    write_mapped(load_movielens(), "/data/ml100k")                       # any DataSplits

The folder holds train_x.npy, train_y.npy, test_x.npy and test_y.npy (plain NumPy files) and
meta.json: the format version, what DataSplits needs besides the tensors (name, task,
num_classes, model_kwargs), the arrays' dtypes and shapes, and the parameters that made it.

Why a file and not shared memory: an in-memory set is copied into /dev/shm once and every worker
maps that copy; a mapped set is read from the page cache, which every process shares, so nothing
is copied at all and the data may be larger than memory (the kernel keeps the pages it can). A
mapped tensor never travels through torch's pickling (its reductions would copy it into shared
memory): the trainer sends its `MappedArray` (path, dtype, shape, offset) and the worker maps the
file itself. The training split is mapped read-only (an index_select reads it; a read-only
mapping commits no memory, however large), the test split copy-on-write (a model may write into
its input in place); a `MappedFile` gives back the pages of the rows a worker is done with, so
its resident share stays bounded while it walks through a file larger than memory.

Written once, atomically: into a hidden folder beside the target, fsynced, then renamed into
place. A write that is interrupted (Ctrl-C, a kill, a full disk) leaves at most that hidden
folder, which no reader looks at and the next write on this machine removes once its process is
gone. Generators write in bounded chunks (`MappedWriter.array(...).write(chunk)`), so a set is
never whole in memory. `cached` is what the loaders' `cache_dir` argument does: the set for these
parameters under `<cache_dir>/<name>-<digest>`, written the first time, mapped every time.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import mmap
import os
import secrets
import shutil
import socket
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hogwild.data.base import DataError, DataSplits, make_folder

log = logging.getLogger("hogwild.data")

FORMAT = "hogwild-mapped"
VERSION = 1  # raised when a reader of the old format could not read the new one
META = "meta.json"
SPLITS = ("train_x", "train_y", "test_x", "test_y")
TENSOR_ATTRIBUTE = "hogwild_mapped"  # a mapped tensor's MappedArray, set on the tensor itself
CHUNK_BYTES = 64 * 2**20  # rows copied per write when a whole tensor is written


@dataclass(frozen=True)
class MappedArray:
    """Where a mapped tensor's rows are: what a worker receives instead of the tensor."""

    path: str
    dtype: str  # NumPy's spelling, e.g. '<i8'
    shape: tuple[int, ...]
    offset: int  # bytes before the first row (the .npy header, and skipped rows)

    @property
    def row_bytes(self) -> int:
        return np.dtype(self.dtype).itemsize * math.prod(self.shape[1:])

    @property
    def nbytes(self) -> int:
        return self.row_bytes * self.shape[0]

    def rows(self, lo: int, hi: int) -> MappedArray:
        """Rows lo..hi-1 of this array, still a file."""
        lo, hi, _ = slice(lo, hi).indices(self.shape[0])
        hi = max(lo, hi)
        return MappedArray(
            self.path, self.dtype, (hi - lo, *self.shape[1:]), self.offset + lo * self.row_bytes
        )

    def open(self, writable: bool = False) -> MappedFile:
        return MappedFile(self, writable)


class MappedFile:
    """One array mapped from its file: `tensor`, and the pages it can give back. Read-only
    unless `writable` (copy-on-write: a write stays private to the process)."""

    def __init__(self, array: MappedArray, writable: bool = False):
        self.array = array
        with open(array.path, "rb") as f:
            self.map = mmap.mmap(
                f.fileno(), 0, access=mmap.ACCESS_COPY if writable else mmap.ACCESS_READ
            )
        count = math.prod(array.shape)
        values = np.frombuffer(self.map, np.dtype(array.dtype), count, array.offset)
        with warnings.catch_warnings():  # torch warns of a read-only array: nothing writes it
            warnings.simplefilter("ignore", UserWarning)
            self.tensor = torch.from_numpy(values.reshape(array.shape))
        setattr(self.tensor, TENSOR_ATTRIBUTE, array)

    def _advise(self, advice: int | None, lo: int, hi: int) -> None:
        page, row = mmap.PAGESIZE, self.array.row_bytes
        start = (self.array.offset + lo * row) // page * page  # whole pages that hold any row
        stop = -(-(self.array.offset + hi * row) // page) * page
        if advice is not None and hi > lo and start < len(self.map):
            self.map.madvise(advice, start, min(stop, len(self.map)) - start)

    def release(self, lo: int, hi: int) -> None:
        """Unmap the pages of rows lo..hi-1 from this process (they stay in the page cache,
        and come back on the next read; a copy-on-write mapping's own writes there are lost):
        what a worker's resident share is bounded by."""
        self._advise(getattr(mmap, "MADV_DONTNEED", None), lo, hi)

    def prefetch(self, lo: int, hi: int) -> None:
        """Ask the kernel to read rows lo..hi-1 ahead, in one go rather than page by page."""
        self._advise(getattr(mmap, "MADV_WILLNEED", None), lo, hi)


def mapped_array(tensor: torch.Tensor) -> MappedArray | None:
    """The file a tensor maps, or None for an in-memory tensor (a copy or a view of a mapped
    tensor is in memory, as far as this knows: `take_rows` keeps a row slice mapped)."""
    return getattr(tensor, TENSOR_ATTRIBUTE, None)


def take_rows(tensor: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """tensor[lo:hi], still marked as its file's rows when the tensor is mapped."""
    part = tensor[lo:hi]
    if (array := mapped_array(tensor)) is not None:
        setattr(part, TENSOR_ATTRIBUTE, array.rows(lo, hi))
    return part


# ---- writing ----


class _ArrayFile:
    """One .npy file being written, row chunk by row chunk."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: np.dtype):
        self.path, self.shape, self.dtype = path, shape, dtype
        self.file = open(path, "wb")  # closed by MappedWriter
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False}
        np.lib.format.write_array_header_1_0(self.file, {**header, "shape": shape})
        self.rows = 0

    def write(self, chunk: np.ndarray | torch.Tensor) -> None:
        """The next rows, in order."""
        if isinstance(chunk, torch.Tensor):
            chunk = chunk.numpy()
        chunk = np.ascontiguousarray(chunk, dtype=self.dtype)
        if chunk.shape[1:] != self.shape[1:] or self.rows + len(chunk) > self.shape[0]:
            raise ValueError(
                f"{self.path.name}: rows of shape {chunk.shape[1:]} after {self.rows}: "
                f"the array is {self.shape}"
            )
        self.file.write(memoryview(chunk).cast("B"))
        self.rows += len(chunk)


class MappedWriter:
    """Writes one mapped set into a hidden folder beside `folder`; `finish` renames it into
    place. Leaving the `with` block any other way (an error, Ctrl-C) removes the hidden folder."""

    def __init__(self, folder: str | os.PathLike, params: Mapping[str, Any] | None = None):
        self.folder = Path(folder).expanduser().absolute()
        self.params = dict(params or {})
        self.files: dict[str, _ArrayFile] = {}
        parent = self.folder.parent
        make_folder(parent, "choose a writable folder")
        remove_abandoned(self.folder)
        self.tmp = parent / (
            f".{self.folder.name}.tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        try:
            self.tmp.mkdir()
        except OSError as e:
            raise DataError(
                f"cannot write into {parent} ({e.strerror or e}): choose a writable folder"
            ) from None

    def __enter__(self) -> MappedWriter:
        return self

    def __exit__(self, kind, value, tb) -> None:
        for f in self.files.values():
            f.file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def array(self, name: str, shape: Iterable[int], dtype: Any) -> _ArrayFile:
        """The file of split tensor `name` (train_x, ...), to be filled with `write(rows)`."""
        if name not in SPLITS:
            raise ValueError(f"{name!r}: must be one of {', '.join(SPLITS)}")
        dtype = (
            torch.empty(0, dtype=dtype).numpy().dtype if isinstance(dtype, torch.dtype) else dtype
        )
        self.files[name] = _ArrayFile(self.tmp / f"{name}.npy", tuple(shape), np.dtype(dtype))
        return self.files[name]

    def finish(
        self, name: str, task: str, num_classes: int, model_kwargs: Mapping[str, Any]
    ) -> None:
        """Every row written: sync the files, write meta.json, rename the folder into place.
        Another process that finished the same set first wins; this copy is dropped."""
        if missing := [n for n in SPLITS if n not in self.files]:
            raise ValueError(f"{', '.join(missing)} never written")
        arrays = {}
        for n, f in self.files.items():
            if f.rows != f.shape[0]:
                raise ValueError(f"{n}: {f.rows} of {f.shape[0]} rows written")
            f.file.flush()
            os.fsync(f.file.fileno())
            f.file.close()
            arrays[n] = {"dtype": f.dtype.str, "shape": list(f.shape)}
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "name": name,
            "task": task,
            "num_classes": num_classes,
            "model_kwargs": dict(model_kwargs),
            "arrays": arrays,
            "params": self.params,
        }
        with open(self.tmp / META, "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_folder(self.tmp)
        try:
            os.rename(self.tmp, self.folder)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            log.info("%s was written by another process meanwhile: using that one", self.folder)
            return  # __exit__ removes this copy
        _fsync_folder(self.folder.parent)


def _fsync_folder(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_abandoned(folder: Path) -> int:
    """Remove the hidden folders of writes of `folder` whose process on this machine is gone
    (a write killed before it could clean up). Returns how many were removed."""
    removed, host = 0, socket.gethostname()
    prefix = f".{folder.name}.tmp-{host}-"
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder.parent):
            if not entry.name.startswith(prefix):
                continue
            pid = entry.name[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_splits(writer: MappedWriter, splits: DataSplits) -> None:
    """All of an in-memory set, a bounded chunk at a time, then `finish`."""
    for name in SPLITS:
        t = getattr(splits, name)
        out = writer.array(name, t.shape, t.dtype)
        step = max(1, CHUNK_BYTES // max(1, t[:1].numel() * t.element_size()))
        for lo in range(0, len(t), step):
            out.write(t[lo : lo + step].contiguous())
    writer.finish(splits.name, splits.task, splits.num_classes, splits.model_kwargs)


def write_mapped(
    splits: DataSplits, folder: str | os.PathLike, params: Mapping[str, Any] | None = None
) -> DataSplits:
    """Write an in-memory set as a mapped folder (atomically) and return it, mapped."""
    try:
        with MappedWriter(folder, params) as writer:
            write_splits(writer, splits)
    except OSError as e:
        raise DataError(
            f"{folder}: could not be written ({e.strerror or e}); nothing was kept"
        ) from None
    return open_mapped(folder, params=params)


# ---- reading ----


def _read_meta(folder: Path, where: str) -> dict[str, Any]:
    if not folder.is_dir():
        raise DataError(f"{where}: no such folder: write it first (docs/data.md)")
    try:
        meta = json.loads((folder / META).read_text())
    except FileNotFoundError:
        raise DataError(
            f"{where}: no {META}: not a mapped data set, or its write never finished; "
            "delete it and write it again (docs/data.md)"
        ) from None
    except (OSError, ValueError) as e:
        raise DataError(
            f"{where}: {META} is damaged ({e}): delete the folder and write it again"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataError(f"{where}: {META} is not a {FORMAT} description: not a mapped data set")
    if not isinstance(meta.get("version"), int) or meta["version"] > VERSION:
        raise DataError(
            f"{where}: format version {meta.get('version')!r}: this hogwild reads version {VERSION}; "
            "write it again with this version, or upgrade hogwild"
        )
    return meta


def _array(folder: Path, name: str, meta: dict[str, Any], where: str) -> MappedArray:
    path = folder / f"{name}.npy"
    try:
        info = meta["arrays"][name]
        want_dtype, want_shape = np.dtype(info["dtype"]), tuple(int(d) for d in info["shape"])
    except (KeyError, TypeError, ValueError):
        raise DataError(
            f"{where}: {META} does not describe {name}: delete the folder and write it again"
        ) from None
    try:
        with open(path, "rb") as f:
            major, minor = np.lib.format.read_magic(f)
            read = (
                np.lib.format.read_array_header_1_0
                if major == 1
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read(f)
            offset, size = f.tell(), os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise DataError(
            f"{where}: {name}.npy is missing: delete the folder and write it again"
        ) from None
    except (OSError, ValueError) as e:
        raise DataError(
            f"{where}: {name}.npy is damaged ({e}): delete the folder and write it again"
        ) from None
    if fortran or dtype != want_dtype or tuple(shape) != want_shape:
        raise DataError(
            f"{where}: {name}.npy holds {dtype} {tuple(shape)} but {META} says {want_dtype} "
            f"{want_shape}: delete the folder and write it again"
        )
    array = MappedArray(str(path), dtype.str, tuple(shape), offset)
    if size != offset + array.nbytes:
        raise DataError(
            f"{where}: {name}.npy has {size:,} bytes, {offset + array.nbytes:,} expected (cut short?): "
            "delete the folder and write it again"
        )
    return array


def open_mapped(
    folder: str | os.PathLike,
    params: Mapping[str, Any] | None = None,
    where: str | None = None,
) -> DataSplits:
    """A written folder, mapped: read-only training split, copy-on-write test split. With
    `params`, the folder must have been written for exactly those. `where` names the folder in
    errors (a config key and its value)."""
    folder = Path(folder).expanduser().absolute()
    where = where or str(folder)
    meta = _read_meta(folder, where)
    if params is not None and meta.get("params") != json.loads(json.dumps(dict(params))):
        was = meta.get("params") or {}
        diff = [k for k in sorted(set(was) | set(params)) if was.get(k) != params.get(k)]
        shown = ", ".join(f"{k}={was.get(k)!r} there, {params.get(k)!r} here" for k in diff[:3])
        raise DataError(
            f"{where}: written for other parameters ({shown}): delete it, the next run writes it again"
        )
    files = {n: _array(folder, n, meta, where).open(writable=n.startswith("test")) for n in SPLITS}
    try:
        splits = DataSplits(
            **{n: f.tensor for n, f in files.items()},
            num_classes=int(meta.get("num_classes", 0)),
            name=str(meta.get("name", folder.name)),
            task=str(meta.get("task", "classification")),
            model_kwargs=dict(meta.get("model_kwargs") or {}),
        )
    except DataError as e:
        raise DataError(f"{where}: {e}: delete the folder and write it again") from None
    for f in files.values():  # the label check's pages: the orchestrator keeps none of them
        f.release(0, f.array.shape[0])
    return splits


def load_mapped(path: str | os.PathLike | None = None) -> DataSplits:
    """`data=mapped`: a folder written before (by a loader's `cache_dir`, or `write_mapped`)."""
    if path is None or str(path) == "":
        raise DataError(
            "data.path=None: must be the folder of a mapped data set, e.g. one that "
            "data.cache_dir=... wrote (docs/data.md)"
        )
    return open_mapped(path, where=f"data.path={path}")


def digest(params: Mapping[str, Any]) -> str:
    """The short name of a set's parameters: the cache folder's suffix."""
    text = json.dumps(dict(params), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cached(
    cache_dir: str | os.PathLike,
    name: str,
    params: Mapping[str, Any],
    write: Callable[[MappedWriter], None],
) -> DataSplits:
    """The set these parameters make, under `<cache_dir>/<name>-<digest>`: mapped when it was
    written before, else written once by `write(writer)` (which ends with `writer.finish`)."""
    params = json.loads(json.dumps({"loader": name, "format": VERSION, **params}, default=str))
    folder = Path(cache_dir).expanduser().absolute() / f"{name}-{digest(params)}"
    where = f"data.cache_dir={cache_dir}: {folder}"
    if not folder.exists():
        log.info("writing %s once (later runs with these parameters map it)", folder)
        started = time.monotonic()
        try:
            with MappedWriter(folder, params) as writer:
                write(writer)
                if not folder.exists():
                    raise ValueError(f"{name}: the writer never finished {folder}")
        except OSError as e:
            raise DataError(
                f"{where}: could not be written ({e.strerror or e}); nothing was kept: "
                "free some space or choose another data.cache_dir"
            ) from None
        log.info("wrote %s in %.1f s", folder, time.monotonic() - started)
    return open_mapped(folder, params, where)
