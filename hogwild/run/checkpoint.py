"""Checkpoints: data, not code. Written atomically in a stream, loaded with `weights_only=True`.

A checkpoint holds the model's state dict, the per-rank progress table (epoch, batch, samples,
steps; under torchrun every node's workers, rank-major), the shared optimizer state when the
run has one (`optimizer.shared=true`), the fields a resumed run must agree on, and the composed
config — tensors and plain Python types only, so `torch.load(weights_only=True)`
accepts it and a hostile file cannot run code. A save goes to a temp file in the same folder, is
fsynced, then `os.replace`d over the old one: a kill at any moment leaves either the old or the
new checkpoint, never half of one (the temp file a kill leaves behind, `.last.<random>.tmp`, is
removed by the next run that claims the folder: hogwild.run.folder.Claim). It carries a CRC-32
of its tensors, checked on load; weights that are not finite are never written (over a good
checkpoint or at all), and a write error is one line naming the file and the reason
(hogwild.run.folder.write_error).

A save streams, so its cost stays flat as the model grows: torch.save writes the file's
structure with the storages' bytes left out (torch.serialization.skip_data), then every storage
is copied from the live tensor, `chunk_bytes` at a time, into a bounce buffer that is checked
(finite), then checksummed and written at its place in the file (os.pwrite) by a thread while
the next chunk is copied into the other buffer; the kernel is asked to start writing each chunk
to disk at once. Nothing is cloned: the extra memory is two chunks whatever the model's size,
and the file goes at the disk's speed (scripts/checkpoint_speed.py). The workers go on writing
the weights meanwhile (Hogwild): each CRC is of the bytes written, so a checkpoint always
matches its checksum, and holds each chunk as it was when it was copied. The CRCs (one per
storage, format 2) are a tensor whose bytes are written last; the zip's own CRC-32 fields,
which skip_data leaves at 0, are filled in too, so zip tools find the file sound.

A load maps the file (`mmap=True`) instead of reading it: its tensors view the file, and the
caller copies them where they belong (model.load_state_dict) and drops the state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import mmap
import os
import pickle
import queue
import struct
import tempfile
import threading
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

import torch

from hogwild.cadence import Cadence
from hogwild.errors import CheckpointError, RunFolderError
from hogwild.run import folder as run_folder

FORMAT = 2  # 2: the checksum is a tensor, a CRC-32 per storage; 1: one int over the tensors
FORMATS = (1, FORMAT)  # what load reads
CHUNK_BYTES = 32 << 20  # a save's bounce buffers, two: its extra memory whatever the size
# What a resumed run must share with the run it continues, or the shards would not line up;
# in the order a user would look for the cause (a data set changes num_train and batch_size).
# `epochs` may grow: a resumed run continues to the new total ("train 5 more epochs").
MUST_MATCH = (
    "data",
    "model",
    "num_train",
    "batch_size",
    "num_workers",
    "seed",
    "world_size",
    "shuffle",  # mapped data goes in blocks (hogwild.workloads.supervised.BlockShard)
)
# what a checkpoint that does not record a fact had: one node, the permutation of in-memory data
DEFAULTS = {"world_size": 1, "shuffle": "permutation"}
WHAT = {"data": "data set", "model": "model"}


def save(
    path: str,
    model: torch.nn.Module,
    progress: torch.Tensor,
    run: Mapping[str, Any],
    config: Mapping,
    optimizer_state: list[dict[str, torch.Tensor]] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> None:
    """Write the live weights (and shared optimizer state) to `path`, `chunk_bytes` at a time."""
    state = {
        "format": FORMAT,
        "model": {k: v.detach() for k, v in model.state_dict().items()},
        "progress": progress.detach().cpu().clone(),
        "run": dict(run),
        "config": _plain(config),
    }
    if optimizer_state:  # one dict of tensors per parameter (hogwild.optim.shared_state)
        state["optimizer_state"] = [{k: v.detach() for k, v in s.items()} for s in optimizer_state]
    stored = storages(state)
    state["checksum"] = torch.zeros(len(stored), dtype=torch.int64)  # filled last
    try:
        _write_atomically(path, lambda f, tmp: _stream(f, tmp, path, state, stored, chunk_bytes))
    except OSError as e:
        raise run_folder.write_error(path, e) from None


@dataclasses.dataclass
class _Stored:
    storage: torch.UntypedStorage
    dtype: torch.dtype
    name: str  # where it is in the state: 'net.1.weight', 'progress', 'optimizer_state[0].step'
    weights: bool  # the model's floating-point weights: never written unless finite


def _tensors(obj: Any, where: tuple = ()) -> Iterator[tuple[tuple, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield where, obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _tensors(v, (*where, k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, (*where, i))


def storages(state: Mapping[str, Any]) -> list[_Stored]:
    """Every storage of the state's tensors, once, in the order torch.save numbers them (its
    pickler meets them depth first, dicts in insertion order): the file's records data/0, 1..."""
    seen, out = set(), []
    for where, t in _tensors(state):
        storage = t.untyped_storage()
        if storage._cdata in seen:
            continue
        seen.add(storage._cdata)
        name = str(where[1]) if where[0] == "model" else str(where[0])
        name += "".join(
            f"[{k}]" if isinstance(k, int) else f".{k}" for k in where[1 + (where[0] == "model") :]
        )
        floating = t.dtype.is_floating_point or t.dtype.is_complex
        out.append(_Stored(storage, t.dtype, name, where[0] == "model" and floating))
    return out


def on_cpu(state: Mapping[str, Any], stored: list[_Stored]) -> Any:
    """The state torch.save writes: a tensor on another device (CUDA) is replaced by a CPU one of
    the same layout over a storage never touched (skip_data reads none of it, and the memory is
    never made resident), so the file says 'cpu', as a save of `.cpu()` copies would."""
    if all(s.storage.device.type == "cpu" for s in stored):
        return state
    hosts: dict[int, torch.UntypedStorage] = {}

    def cpu(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu":
                return obj
            s = obj.untyped_storage()
            host = hosts.setdefault(s._cdata, torch.UntypedStorage(s.nbytes()))
            return torch.empty(0, dtype=obj.dtype).set_(
                host, obj.storage_offset(), obj.size(), obj.stride()
            )
        if isinstance(obj, Mapping):
            return {k: cpu(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(cpu(v) for v in obj)
        return obj

    return cpu(state)


def _stream(
    f: IO[bytes], tmp: str, path: str, state: dict, stored: list[_Stored], chunk_bytes: int
) -> None:
    with torch.serialization.skip_data():  # the structure; the storages' bytes are holes
        torch.save(on_cpu(state, stored), f)
    f.flush()
    checksum = state["checksum"]
    records = _records(f.fileno(), tmp)
    sizes = [s.storage.nbytes() for s in stored] + [checksum.untyped_storage().nbytes()]
    if [r.size for r in records] != sizes:  # a torch that numbers its storages otherwise
        raise RuntimeError(
            f"torch.save laid the storages out otherwise than hogwild expects: records of "
            f"{[r.size for r in records]} bytes for storages of {sizes}"
        )
    largest = -(-max(sizes) // 64) * 64
    writer = _Writer(f.fileno(), max(64, min(chunk_bytes, largest) // 64 * 64))  # whole elements
    try:
        for i, (s, record) in enumerate(zip(stored, records, strict=False)):
            if not writer.send(i, as_bytes(s.storage), record.offset, s):
                raise CheckpointError(  # never over a good one: the last good checkpoint stays
                    f"not writing {path}: the shared weights are not finite ({s.name}); "
                    "the last checkpoint written, if any, is kept"
                )
        crcs = writer.crcs(len(stored))  # every chunk written
        checksum.copy_(torch.tensor(crcs, dtype=torch.int64))
        writer.send(len(stored), as_bytes(checksum.untyped_storage()), records[-1].offset)
        crcs = writer.crcs(len(records))
    finally:
        writer.close()
    for record, crc in zip(records, crcs, strict=True):  # the zip's own: skip_data left 0 there
        for at in record.crc_at:
            _pwrite(f.fileno(), struct.pack("<I", crc), at)


class _Writer:
    """Writes the chunks the caller copies: two bounce buffers, one being filled (copied from
    the live tensor, checked) while a thread checksums and writes the other, and asks the kernel
    to start writing it to disk (the final fsync then has little left to wait for)."""

    def __init__(self, fd: int, chunk: int):
        self.fd, self.chunk, self.error = fd, chunk, None
        self.free: queue.SimpleQueue = queue.SimpleQueue()
        self.full: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(2):
            self.free.put(torch.empty(chunk, dtype=torch.uint8))
        self.crc: dict[int, int] = {}  # record -> CRC-32 of its bytes written so far
        self.thread = threading.Thread(target=self._run, name="hogwild-checkpoint", daemon=True)
        self.thread.start()

    def send(
        self, record: int, source: torch.Tensor, offset: int, s: _Stored | None = None
    ) -> bool:
        """Queue `source`'s bytes for `offset`, a chunk at a time; False (and nothing more
        queued) when they are weights that are not finite. The bytes are copied first: the
        workers may change the source meanwhile."""
        total = source.numel()
        for start in range(0, total, self.chunk):
            n = min(self.chunk, total - start)
            bounce = self.free.get()
            if self.error is not None:
                raise self.error
            bounce[:n].copy_(source[start : start + n])
            if s is not None and s.weights and not finite(bounce[:n].view(s.dtype)):
                self.free.put(bounce)
                return False
            self.full.put((record, bounce, n, offset + start))
        return True

    def crcs(self, count: int) -> list[int]:
        """The CRC-32 of records 0..count-1, once all that was sent is written."""
        buffers = [self.free.get() for _ in range(2)]
        for b in buffers:
            self.free.put(b)
        if self.error is not None:
            raise self.error
        return [self.crc.get(i, 0) for i in range(count)]

    def close(self) -> None:
        """End the thread once what was sent is written: the file is not closed under it."""
        self.full.put(None)
        self.thread.join()

    def _run(self) -> None:
        while (item := self.full.get()) is not None:
            record, bounce, n, offset = item
            if self.error is None:
                try:
                    data = bounce.numpy()[:n]
                    self.crc[record] = zlib.crc32(data, self.crc.get(record, 0))
                    _pwrite(self.fd, data, offset)
                    _start_writeback(self.fd, offset, n)
                except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
                    self.error = e
            self.free.put(bounce)


def _start_writeback(fd: int, offset: int, n: int) -> None:
    """Have the kernel start writing these bytes to disk now, not at the fsync: the disk works
    while the next chunks are copied. (DONTNEED starts the writeback of dirty pages and drops
    only clean ones: none of these yet.)"""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):  # only advice
            os.posix_fadvise(fd, offset, n, os.POSIX_FADV_DONTNEED)


def as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def finite(x: torch.Tensor) -> bool:
    """Whether every value is finite: its min and max are (a NaN spreads to both). One pass
    with no temporary, ten times as fast as isfinite().all() (which makes a bool per value)."""
    if x.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        low, high = torch.aminmax(x)
        return math.isfinite(low) and math.isfinite(high)
    return bool(torch.isfinite(x).all())


def _pwrite(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:  # never for a regular file; not a loop forever if it were
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        view, offset = view[n:], offset + n


@dataclasses.dataclass
class _Record:
    offset: int  # where its bytes start in the file
    size: int
    crc_at: list[int]  # where the zip keeps its CRC-32: central directory, data descriptor


_CENTRAL, _DESCRIPTOR = b"PK\x01\x02", b"PK\x07\x08"


def _records(fd: int, tmp: str) -> list[_Record]:
    """Where torch.save put the storages' records, data/0, data/1, ..., and their CRC fields."""
    with zipfile.ZipFile(tmp) as z:
        infos, start = z.infolist(), z.start_dir
    directory = os.pread(fd, os.fstat(fd).st_size - start, start)  # and its end: a few KiB
    crc_at, at = {}, 0
    while directory[at : at + 4] == _CENTRAL:
        n, extra, comment = struct.unpack_from("<HHH", directory, at + 28)
        crc_at[directory[at + 46 : at + 46 + n].decode()] = start + at + 16
        at += 46 + n + extra + comment
    records = {}
    for info in infos:
        key = info.orig_filename.partition("/")[2]  # <archive>/data/<i>
        if not key.startswith("data/"):
            continue
        n, extra = struct.unpack_from("<HH", os.pread(fd, 30, info.header_offset), 26)
        offset = info.header_offset + 30 + n + extra
        fields = [crc_at[info.orig_filename]]
        if os.pread(fd, 4, offset + info.file_size) == _DESCRIPTOR:
            fields.append(offset + info.file_size + 4)
        records[key] = _Record(offset, info.file_size, fields)
    return [records[f"data/{i}"] for i in range(len(records))]


def _write_atomically(path: str, write: Callable[[IO[bytes], str], None]) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    with contextlib.suppress(FileExistsError):  # checkpoints/, never the run folder above it:
        os.mkdir(folder)  # a run folder removed meanwhile is not silently made again
    prefix, suffix = run_folder.PARTIAL  # removed when a run claims the folder, if still there
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f, tmp)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a checkpoint is an ordinary output file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def checksum(state: Mapping[str, Any]) -> int:
    """Format 1's CRC-32: every tensor's bytes (the model's, then the optimizer state's), in
    order, as one int."""
    crc = 0
    tensors = [*state["model"].values()]
    for s in state.get("optimizer_state") or []:
        tensors.extend(s[k] for k in sorted(s))
    for t in tensors:
        if isinstance(t, torch.Tensor):
            crc = zlib.crc32(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy(), crc)
    return crc


def _mismatch(state: Mapping[str, Any]) -> str | None:
    """Why the state does not match its checksum, None when it does (or has none: older ones)."""
    saved = state.get("checksum")
    if saved is None:
        return None
    if isinstance(saved, int):  # format 1
        return None if saved == checksum(state) else ""
    if not (isinstance(saved, torch.Tensor) and saved.dtype == torch.int64 and saved.dim() == 1):
        return "the checksum is malformed; "
    own = saved.untyped_storage()._cdata
    stored = [s for s in storages(state) if s.storage._cdata != own]
    if len(stored) != saved.numel():
        return "the checksum counts another number of tensors; "
    for s, crc in zip(stored, saved.tolist(), strict=True):
        if zlib.crc32(as_bytes(s.storage).numpy()) != crc:
            return f"{s.name} differs; "
    return None


def _is_zip(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def load(path: str) -> dict[str, Any]:
    """Load and sanity-check a checkpoint; every problem is one CheckpointError line.

    The tensors map the file (a private mapping: writing to them never changes it), so a resume
    reads the model once, into the model: copy them where they belong and drop the state. The
    mapping, and the file it keeps even after an os.replace over it, ends with the last tensor
    that views it; the progress table is a copy, free to outlive the state."""
    if not os.path.isfile(path):
        raise CheckpointError(f"resume_from={path!r}: no such file")
    try:
        with (
            warnings.catch_warnings(),  # e.g. "Detected pickle protocol 4": the error says it all
            torch.serialization.set_default_mmap_options(mmap.MAP_PRIVATE),
        ):
            warnings.simplefilter("ignore")
            # only a zip file can be mapped; any other is refused below in torch's words
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=_is_zip(path))
    except (
        pickle.UnpicklingError,
        RuntimeError,
        zipfile.BadZipFile,
        EOFError,
        ValueError,
        OSError,
    ) as e:
        raise CheckpointError(
            f"resume_from={path!r} is not a loadable hogwild checkpoint: {_reason(e)}"
        ) from None
    if not isinstance(state, dict) or state.get("format") not in FORMATS:
        raise CheckpointError(
            f"resume_from={path!r} is not a hogwild checkpoint (format {FORMAT} expected)"
        )
    for key, kind in (("model", dict), ("progress", torch.Tensor), ("run", dict)):
        if not isinstance(state.get(key), kind):
            raise CheckpointError(
                f"resume_from={path!r} is damaged: '{key}' is missing or malformed"
            )
    saved_optimizer = state.get("optimizer_state")
    if saved_optimizer is not None and not (
        isinstance(saved_optimizer, list)
        and all(
            isinstance(s, dict) and all(isinstance(v, torch.Tensor) for v in s.values())
            for s in saved_optimizer
        )
    ):
        raise CheckpointError(f"resume_from={path!r} is damaged: 'optimizer_state' is malformed")
    mismatch = _mismatch(state)
    if mismatch is not None:
        raise CheckpointError(
            f"resume_from={path!r} is damaged: its tensors do not match their checksum "
            f"({mismatch}the file was changed or corrupted after it was written)"
        )
    for key in ("progress", "checksum"):  # small: copies, that do not keep the mapping alive
        if isinstance(state.get(key), torch.Tensor):
            state[key] = state[key].clone()
    return state


# Boilerplate lines of torch's weights-only refusal; the first one even advises weights_only=False.
_TORCH_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def _reason(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if isinstance(e, pickle.UnpicklingError):
        useful = [line for line in lines if not line.startswith(_TORCH_BOILERPLATE)]
        detail = useful[0].removeprefix("WeightsUnpickler error:").strip() if useful else ""
        return (
            "refused by the weights-only loader (tensors and plain types only, nothing was run)"
            + (f": {detail}" if detail else "")
        )
    return lines[0] if lines else type(e).__name__


def check_compatible(
    path: str, state: Mapping[str, Any], run: Mapping[str, Any], model: torch.nn.Module
) -> None:
    saved = state["run"]
    for key in MUST_MATCH:
        if key in WHAT and key not in saved:  # older checkpoints did not record it
            continue
        was, now = saved.get(key, DEFAULTS.get(key)), run.get(key, DEFAULTS.get(key))
        if was != now and key in WHAT:
            raise CheckpointError(
                f"resume_from={path!r} was written by a run on the {WHAT[key]} {was!r} but this "
                f"run has the {WHAT[key]} {now!r}; resume with the same {WHAT[key]}"
            )
        if was != now:
            raise CheckpointError(
                f"resume_from={path!r} was written with {key}={was!r} but this run has "
                f"{key}={now!r}; resume with the same value"
            )
    if "epochs" in saved and run.get("epochs", saved["epochs"]) < saved["epochs"]:
        raise CheckpointError(
            f"resume_from={path!r} was written for {saved['epochs']} epochs but this run has "
            f"epochs={run['epochs']}; a resumed run can keep or raise the epoch count, not lower it"
        )
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in state["model"].items() if isinstance(v, torch.Tensor)}
    if expected != found:
        diff = sorted(set(expected.items()) ^ set(found.items()))[:3]
        raise CheckpointError(
            f"resume_from={path!r} does not match this model (first differences: {diff})"
        )
    rows = run["num_workers"] * run.get(
        "world_size", DEFAULTS["world_size"]
    )  # every node's workers, rank-major
    if tuple(state["progress"].shape) != (rows, 4):
        raise CheckpointError(
            f"resume_from={path!r} is damaged: its progress table has the wrong shape"
        )


def _plain(value: Any) -> Any:
    """Keep the config to plain types (weights_only loading refuses anything else)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class Checkpointer:
    """Decides when checkpoints/last.pt is due (`checkpoint.every_*`) and writes it.

    `save(table)` writes every node's progress table when one is given (taken at a torchrun
    round), else one snapshot of the live table: the workers keep counting, and the checkpoint's
    sample count must match its rows."""

    def __init__(
        self,
        path: str,
        cfg: Any,
        model: torch.nn.Module,
        progress: torch.Tensor,
        facts: Mapping[str, Any],
        record: Mapping,
        optimizer_state: list | None,
        enabled: bool = True,
    ):
        self.path, self.model, self.progress, self.facts, self.record = (
            path,
            model,
            progress,
            facts,
            record,
        )
        self.optimizer_state, self.enabled = optimizer_state, enabled
        self.error: str | None = None  # why the last save failed (the earlier file is kept)
        self.written = False
        self.every = Cadence(cfg.every_n_steps, cfg.every_seconds, start=int(progress[:, 3].sum()))

    def due(self, steps: int) -> bool:
        if not self.every.due(steps):
            return False
        self.every.mark(steps)
        return True

    def save(self, table: torch.Tensor | None = None) -> None:
        if not self.enabled:
            return
        progress = self.progress.clone() if table is None else table
        run = {**self.facts, "samples_seen": int(progress[:, 2].sum())}
        try:
            save(self.path, self.model, progress, run, self.record, self.optimizer_state)
            self.written = True
        except (CheckpointError, RunFolderError) as e:  # the run loop ends the run with it
            self.error = str(e)
