"""Shared memory: sharing strategies, moving tensors to shared memory, and the pre-flight checks
that turn torch's deep failures ("Too many open files", "No space left on device", a bare
"Bus error") into one clear message before any worker starts, and the failures no check can
foresee (an mmap refused by the address-space limit) into one clear message after the fact,
with nothing left in /dev/shm.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import math
import multiprocessing.forkserver
import os
import re
import resource
import secrets
import shutil
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.multiprocessing as mp
from torch.overrides import TorchFunctionMode

from hogwild.errors import PreflightError, SharedMemoryError

SHM_DIR = "/dev/shm"
# fds a process needs besides the shared tensors: stdio, pipes, sentinels, imported libraries
FD_HEADROOM = 256
# fds a forkserver start sends besides the shared storages: the worker's pipe and the like (3),
# and the 4 of its own (multiprocessing.forkserver.connect_to_new_process)
FORKSERVER_EXTRA_FDS = 3 + 4
# torch's words when a segment it made cannot be mapped (both strategies):
# "unable to mmap 188160000 bytes from file </torch_26373_4083891241_4>: Cannot allocate memory (12)"
# (a segment of hogwild's own, mapped from its fd, is "<filename not specified>" there)
MMAP_FAILED = re.compile(
    r"unable to mmap (\d+) bytes from file <(/torch_[^>]+|filename not specified)>: (.+?) \((\d+)\)"
)
# ... when it cannot open, size or write one: "unable to open shared memory object </torch_...>"
SEGMENT_FAILED = re.compile(r"<(/torch_[^>]+)>")
# ... when a plain allocation fails (a copy made while sharing: the layout, the optimizer state)
ALLOC_FAILED = re.compile(r"can't allocate memory: you tried to allocate (\d+) bytes")


def set_sharing_strategy(strategy: str) -> None:
    """A per-process setting: the orchestrator and every worker call this."""
    mp.set_sharing_strategy(strategy)
    if strategy == "file_system":  # once per process: unregister drops an earlier registration
        atexit.unregister(remove_own_segments)
        atexit.register(remove_own_segments, os.getpid())


def remove_own_segments(pid: int, shm_dir: str = SHM_DIR) -> int:
    """At exit: unlink the file_system segments this process created (torch names them
    torch_<pid>_*). torch_shm_manager does this too, unless it was killed; a name unlinked twice
    is no harm, and a mapping still in use outlives its name. Returns how many were removed."""
    removed = 0
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return 0
    for name in names:
        if name.startswith(f"torch_{pid}_"):
            try:
                os.unlink(os.path.join(shm_dir, name))
                removed += 1
            except OSError:
                pass
    return removed


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors if t.device.type == "cpu")


def check_shm_space(needed_bytes: int, shm_dir: str = SHM_DIR) -> None:
    """Refuse a run whose shared tensors do not fit in /dev/shm's free space."""
    try:
        free = shutil.disk_usage(shm_dir).free
    except FileNotFoundError:
        return  # no /dev/shm (not Linux): torch uses another mechanism
    # 5% headroom: the kernel rounds segments up to pages, and torch adds a little per storage
    if needed_bytes * 1.05 > free:
        raise PreflightError(
            f"{shm_dir} has {free / 2**20:.1f} MiB free but the model and data need "
            f"{needed_bytes / 2**20:.1f} MiB of shared memory: "
            f"{_shm_way_out(shm_dir, 'a smaller data set')}"
        )


def ensure_fd_budget(num_tensors: int, strategy: str) -> None:
    """Under file_descriptor every shared storage holds an open fd in every process.

    Raise the soft open-file limit when the hard limit allows it (children inherit it);
    otherwise refuse with the way out (file_system).
    """
    if strategy != "file_descriptor":
        return
    needed = num_tensors + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard == resource.RLIM_INFINITY or hard >= needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        return
    raise PreflightError(
        f"trainer.sharing_strategy='file_descriptor' needs about {needed} open files for "
        f"{num_tensors} shared tensors, but the open-file limit is {soft} (hard {hard}): "
        "use trainer.sharing_strategy=file_system or raise the limit (ulimit -n)"
    )


def check_fd_passing(num_tensors: int, start_method: str, strategy: str) -> None:
    """forkserver hands a new worker its fds over a socket, at most MAXFDS_TO_SEND (256) in all;
    under file_descriptor that is one per shared storage, and more end in a bare
    "ValueError: too many fds" as the first worker starts. (fork inherits fds; spawn passes any number.)
    """
    if start_method != "forkserver" or strategy != "file_descriptor":
        return
    most = multiprocessing.forkserver.MAXFDS_TO_SEND - FORKSERVER_EXTRA_FDS - 1
    if num_tensors > most:
        raise PreflightError(
            f"trainer.start_method='forkserver' with trainer.sharing_strategy='file_descriptor' can hand a "
            f"worker at most {most} shared tensors, but the model and data have {num_tensors}: "
            "use trainer.sharing_strategy=file_system (or trainer.start_method=spawn)"
        )


# Tensors at least this big are created in shared memory by `born_shared`; smaller ones are
# moved there later as usual (one segment, and under file_descriptor one fd, per tensor).
BORN_SHARED_MIN_BYTES = 2**20
POPULATE_MIN_BYTES = 64 * 2**20  # a born-shared segment this big gets its pages in bulk (populate)
POPULATE_CHUNK = 256 * 2**20  # a multiple of any page size
MADV_POPULATE_WRITE = 23  # linux/mman.h


def born_shared(
    min_bytes: int = BORN_SHARED_MIN_BYTES,
    shm_dir: str = SHM_DIR,
    memory: tuple[int, str] | None = None,
    what: str = "the model",
) -> TorchFunctionMode:
    """Build a model inside this and its big CPU tensors are created in shared memory, where
    `share_memory()` finds them already: no second copy of a big table (which doubles its memory
    for a moment) and no copying into shared memory (seconds per GiB). torch's factory functions
    (`empty`, `zeros`, `ones`, `full`, as every nn module uses for its parameters) are
    intercepted; anything else is created as usual. The sharing strategy must be set first
    (`set_sharing_strategy`): it decides the kind of segment. More than /dev/shm holds, or than
    `memory` (bytes available, and the words that say so), is one SharedMemoryError before a
    page is touched: a table bigger than the machine is refused, not built. `what` is built,
    as the messages say ("the shared optimizer state")."""
    return _BornShared(min_bytes, shm_dir, memory, what)


class _BornShared(TorchFunctionMode):
    def __init__(self, min_bytes: int, shm_dir: str, memory: tuple[int, str] | None, what: str):
        super().__init__()
        self.min_bytes, self.shm_dir, self.memory, self.what = min_bytes, shm_dir, memory, what
        self.total = 0
        try:
            self.free: int | None = shutil.disk_usage(shm_dir).free
        except FileNotFoundError:
            self.free = None  # no /dev/shm (not Linux): torch uses another mechanism

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.empty, torch.zeros, torch.ones, torch.full) and self._plain(kwargs):
            meta = func(*args, **{**kwargs, "device": "meta", "requires_grad": False})
            nbytes = meta.numel() * meta.element_size()
            if nbytes >= self.min_bytes:
                return self._shared(func, meta, nbytes, args, kwargs)
        return func(*args, **kwargs)

    @staticmethod
    def _plain(kwargs: dict[str, Any]) -> bool:
        device = kwargs.get("device")
        return (
            kwargs.get("out") is None
            and kwargs.get("layout") in (None, torch.strided)
            and not kwargs.get("pin_memory")
            and torch.device(device if device is not None else torch.get_default_device()).type
            == "cpu"
        )

    def _shared(self, func, meta: torch.Tensor, nbytes: int, args, kwargs) -> torch.Tensor:
        self.total += nbytes
        if self.memory is not None and self.total > self.memory[0]:
            raise SharedMemoryError(
                f"{self.what} needs at least {_size(self.total)} of memory but "
                f"{_size(self.memory[0])} is {self.memory[1]}: use a smaller model"
            )
        if self.free is not None and self.total * 1.05 > self.free:
            raise SharedMemoryError(
                f"{self.shm_dir} has {_size(self.free)} free but {self.what} needs at least "
                f"{_size(self.total)} of shared memory: "
                f"{_shm_way_out(self.shm_dir, 'a smaller model')}"
            )
        value = None  # torch.empty's: written next (an init), so its pages are made now
        if func is torch.zeros:
            value = 0
        elif func is torch.ones:
            value = 1
        elif func is torch.full:
            value = args[1] if len(args) > 1 else kwargs["fill_value"]
        written = value is None or not _reads_as_zero(value)
        storage = new_segment(nbytes, self.shm_dir, self.what, written)
        t = torch.empty(0, dtype=meta.dtype).set_(storage, 0, meta.shape, meta.stride())
        if value is not None and written:
            t.fill_(value)
        return t.requires_grad_(bool(kwargs.get("requires_grad")))


def _reads_as_zero(value: Any) -> bool:
    """Whether a fill with `value` leaves a new segment's bytes as they are: all zero. -0.0 has
    its sign bit set; tensors and complex numbers are filled as given."""
    if isinstance(value, (bool, int)):
        return value == 0
    if isinstance(value, float):
        return value == 0 and math.copysign(1.0, value) > 0
    return False


def new_segment(
    nbytes: int, shm_dir: str = SHM_DIR, what: str = "the model", written: bool = True
) -> torch.UntypedStorage:
    """A new shared segment of `nbytes`, zero-filled, whose pages are reserved (a write never
    dies of a bus error when /dev/shm is full) and, when this process is about to write it all
    (`written`: an init, a fill) and it is POPULATE_MIN_BYTES or more, made: mapped in bulk,
    not one fault per page. torch's own segment (`_new_shared`) reserves with one
    posix_fallocate, on one core: 1.0-1.3 s for 3 GiB here, and `populate` then maps the pages
    on every core (0.9 s). Under file_descriptor on Linux such a segment is made here instead: a
    file in `shm_dir` that never has a name (O_TMPFILE; where the file system cannot, one
    unlinked as soon as it is open, as torch's own are), sized, mapped by torch as any shared
    storage it receives, and populated, which makes the pages on every core
    (1.5-1.65 s for 3 GiB, all told); where it cannot populate, it reserves as torch does. A
    segment of zeros keeps torch's: reserving is all it needs (each process maps the pages it
    touches in its own page tables: populating here makes none for the workers)."""
    if (
        not written
        or nbytes < POPULATE_MIN_BYTES
        or mp.get_sharing_strategy() != "file_descriptor"
        or not sys.platform.startswith("linux")
    ):
        storage = torch.UntypedStorage._new_shared(nbytes)  # reserved, mapped as touched
        if written and nbytes >= POPULATE_MIN_BYTES:
            populate(storage.data_ptr(), nbytes)
        return storage
    try:
        fd = _unnamed_file(shm_dir)
        try:
            os.ftruncate(fd, nbytes)
            try:
                storage = torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)  # maps a dup
            except RuntimeError as e:  # the mmap refused (ulimit -v): one line, no fd left
                _close_copies(fd)
                raise _shared_memory_error(str(e), what, "a smaller model") or e from None
        finally:
            os.close(fd)
        kept = storage._share_fd_cpu_()[0]
        os.set_inheritable(kept, False)  # as torch's own: not for programs this one runs
        if not populate(storage.data_ptr(), nbytes):
            os.posix_fallocate(kept, 0, nbytes)  # raises ENOSPC
    except OSError as e:
        raise SharedMemoryError(
            f"cannot make {_size(nbytes)} of shared memory in {shm_dir} for {what} "
            f"({e.strerror}): {_shm_way_out(shm_dir, 'a smaller model')}"
        ) from None
    return storage


def _unnamed_file(shm_dir: str) -> int:
    """A new file in `shm_dir` that no other process can open by name, and that no signal can
    leave behind: O_TMPFILE, or a name unlinked as soon as it is open."""
    flags = os.O_RDWR | os.O_CLOEXEC
    try:
        return os.open(shm_dir, flags | os.O_TMPFILE, 0o600)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    path = os.path.join(shm_dir, f"torch_{os.getpid()}_hogwild_{secrets.token_hex(8)}")
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(path)
    return fd


def _close_copies(fd: int) -> None:
    """Close the other fds of this process on `fd`'s file (torch's dup of it, which a failed
    mmap leaves open)."""
    st = os.fstat(fd)
    with contextlib.suppress(OSError):
        for other in map(int, os.listdir("/proc/self/fd")):
            with contextlib.suppress(OSError):
                o = os.fstat(other)
                if other != fd and (o.st_ino, o.st_dev) == (st.st_ino, st.st_dev):
                    os.close(other)


def populate(address: int, nbytes: int) -> bool:
    """Make the pages of a new shared segment now, in bulk and on every core
    (madvise(MADV_POPULATE_WRITE), Linux 5.14+), rather than one page fault at a time as the
    table is first written: a 3 GiB table's random fill took 4.0-5.3 s with the faults here,
    0.7 s of populating + 2.6-3.0 s of fill without them. They would be made anyway: every page
    of a table is filled and checkpointed. False where the kernel cannot (then nothing
    changes: the faults come as before)."""
    import ctypes
    from concurrent.futures import ThreadPoolExecutor

    from hogwild.config.schema import usable_cores

    if not sys.platform.startswith("linux"):  # MADV_POPULATE_WRITE is Linux's number
        return False
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return False
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = os.sysconf("SC_PAGE_SIZE")
    start = address - address % page  # madvise wants a page-aligned start
    end = address + nbytes

    cores = usable_cores()
    per_core = -(-(end - start) // cores)  # every core gets a share, however big the segment
    chunk = min(POPULATE_CHUNK, -(-per_core // 2**21) * 2**21)  # in whole 2 MiB (huge) pages

    def one(lo: int) -> bool:
        return madvise(lo, min(chunk, end - lo), MADV_POPULATE_WRITE) == 0

    with ThreadPoolExecutor(cores) as pool:  # ctypes releases the GIL for the call
        return all(pool.map(one, range(start, end, chunk)))


def share_tensors(tensors: Iterable[torch.Tensor]) -> None:
    for t in tensors:
        if t.device.type == "cpu":
            t.share_memory_()


@contextlib.contextmanager
def translating_failures(what: str, smaller: str) -> Iterator[None]:
    """Around the moves into shared memory of one part of the run (`what`: "the training data"):
    a failure of torch's (a RuntimeError of many lines, deep in the storage code) becomes one
    SharedMemoryError that says what could not be mapped, why, and the way out (`smaller`: "a
    smaller data set"). torch creates a segment by name (torch_<pid>_<...>), sizes it, maps it,
    and only then unlinks the name (file_descriptor) or hands it to torch_shm_manager
    (file_system): when the mapping fails the name stays in /dev/shm, and under file_system an
    fd to it stays open. Both are removed here, for either strategy."""
    try:
        yield
    except RuntimeError as e:
        error = _shared_memory_error(str(e), what, smaller)
        if error is None:
            raise
        raise error from None


def _shared_memory_error(message: str, what: str, smaller: str) -> SharedMemoryError | None:
    mapped = MMAP_FAILED.search(message)
    if mapped is not None:
        size, name, reason, code = mapped.groups()
        remove_failed_segment(name)
        if int(code) == 12:  # ENOMEM: the address-space limit, or the machine's memory
            return SharedMemoryError(
                f"cannot map {_size(int(size))} of shared memory for {what} "
                f"({_memory_limit()}): {_way_out(smaller)}"
            )
        return SharedMemoryError(
            f"cannot map {_size(int(size))} of shared memory for {what}: {reason}"
        )
    allocated = ALLOC_FAILED.search(message)
    if allocated is not None:
        return SharedMemoryError(
            f"cannot allocate {_size(int(allocated[1]))} for {what} ({_memory_limit()}): "
            f"{_way_out(smaller)}"
        )
    segment = SEGMENT_FAILED.search(message)
    if segment is not None:  # torch's own line names the segment and the OS reason
        remove_failed_segment(segment[1])
        first = message.strip().splitlines()[0] if message.strip() else message
        return SharedMemoryError(f"cannot put {what} into shared memory: {first}")
    return None


def remove_failed_segment(name: str, shm_dir: str = SHM_DIR) -> None:
    """Unlink a segment torch created but could not map (`name`: "/torch_<pid>_<...>", as torch
    writes it), and close any fd this process still holds on it. Only this process's own: the
    name carries its creator's pid."""
    base = name.lstrip("/")
    if not base.startswith(f"torch_{os.getpid()}_") or os.sep in base:
        return
    path = os.path.join(shm_dir, base)
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                if os.readlink(f"/proc/self/fd/{fd}") == path:
                    os.close(int(fd))
    with contextlib.suppress(OSError):
        os.unlink(path)


def _memory_limit() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        return f"address-space limit {_size(soft)}: ulimit -v"
    return "out of memory"


def _way_out(smaller: str) -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        return f"raise the limit or use {smaller}"
    return f"free some memory or use {smaller}"


def _shm_way_out(shm_dir: str, smaller: str) -> str:
    """The way out when `shm_dir` (a tmpfs of its own size) is too small."""
    return f"free space in {shm_dir}, enlarge it (e.g. docker --shm-size), or use {smaller}"


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
