"""Moving tensors into shared memory: a failure of torch's (many lines, deep in its storage code)
becomes one line that says what could not be mapped and the way out, and the segment torch
created for it is gone (hogwild.process.sharing.translating_failures)."""

from __future__ import annotations

import contextlib
import os
import resource
import uuid

import psutil
import pytest
import torch
import torch.multiprocessing as mp

from hogwild.errors import HogwildError, PreflightError, SharedMemoryError
from hogwild.process import sharing


@contextlib.contextmanager
def address_space(limit: int):
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def segment(pid: int):
    """A file in /dev/shm named as torch names a segment of process `pid`."""
    name = f"torch_{pid}_hogwildtest{uuid.uuid4().hex[:8]}_0"
    path = os.path.join(sharing.SHM_DIR, name)
    with open(path, "wb"):
        pass
    try:
        yield name, path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def own_segments() -> set[str]:
    return {n for n in os.listdir(sharing.SHM_DIR) if n.startswith(f"torch_{os.getpid()}_")}


needs_shm = pytest.mark.skipif(not os.path.isdir(sharing.SHM_DIR), reason="no /dev/shm")


@needs_shm
def test_an_mmap_refused_by_the_limit_is_one_line_and_its_segment_is_removed():
    limit = 2**40  # far above this process's footprint: only the message reads it
    with segment(os.getpid()) as (name, path), address_space(limit):
        with pytest.raises(SharedMemoryError) as caught:
            with sharing.translating_failures("the training data", "a smaller data set"):
                raise RuntimeError(
                    f"unable to mmap 188160000 bytes from file </{name}>: Cannot allocate memory (12)"
                )
        assert not os.path.exists(path)
    message = str(caught.value)
    assert message == (
        "cannot map 179.4 MiB of shared memory for the training data "
        "(address-space limit 1024.0 GiB: ulimit -v): raise the limit or use a smaller data set"
    )
    assert isinstance(caught.value, PreflightError) and isinstance(caught.value, HogwildError)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@needs_shm
def test_without_a_limit_the_way_out_is_memory():
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        pytest.skip("this process runs under an address-space limit")
    with pytest.raises(SharedMemoryError, match=r"\(out of memory\): free some memory or use"):
        with sharing.translating_failures("the model", "a smaller model"):
            raise RuntimeError(
                f"unable to mmap 4096 bytes from file </torch_{os.getpid()}_1_2>: "
                "Cannot allocate memory (12)"
            )


@needs_shm
def test_another_process_segment_is_never_removed():
    other = os.getppid()
    with segment(other) as (name, path):
        with pytest.raises(SharedMemoryError):
            with sharing.translating_failures("the model", "a smaller model"):
                raise RuntimeError(
                    f"unable to mmap 4096 bytes from file </{name}>: Cannot allocate memory (12)"
                )
        assert os.path.exists(path)


def test_other_errors_pass_through_unchanged():
    error = RuntimeError("something else entirely")
    with pytest.raises(RuntimeError) as caught:
        with sharing.translating_failures("the model", "a smaller model"):
            raise error
    assert caught.value is error
    with pytest.raises(ValueError):
        with sharing.translating_failures("the model", "a smaller model"):
            raise ValueError("unable to mmap 1 bytes from file </torch_1_1_1>: x (12)")


def test_a_failed_allocation_while_sharing_is_one_line_too():
    with pytest.raises(
        SharedMemoryError, match=r"^cannot allocate 448\.6 MiB for the training data"
    ):
        with sharing.translating_failures("the training data", "a smaller data set"):
            raise RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                "allocate memory: you tried to allocate 470400000 bytes. Error code 12 "
                "(Cannot allocate memory)"
            )


@needs_shm
def test_a_real_mmap_refused_by_the_address_space_limit():
    """torch itself, under file_descriptor (no torch_shm_manager: no process is started): the
    segment it made for the tensor is gone, and so is any fd on it."""
    previous = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_descriptor")
    tensor = torch.zeros(16 * 2**20)  # 64 MiB, allocated before the limit
    before, fds = own_segments(), set(os.listdir("/proc/self/fd"))
    try:
        # 16 MiB above what this process holds now: the 64 MiB mapping cannot fit
        with address_space(psutil.Process().memory_info().vms + 16 * 2**20):
            with pytest.raises(SharedMemoryError) as caught:
                with sharing.translating_failures("the training data", "a smaller data set"):
                    tensor.share_memory_()
    finally:
        mp.set_sharing_strategy(previous)
    assert str(caught.value).startswith(
        "cannot map 64.0 MiB of shared memory for the training data (address-space limit "
    )
    assert own_segments() == before
    leaked = [
        os.readlink(f"/proc/self/fd/{fd}")
        for fd in set(os.listdir("/proc/self/fd")) - fds
        if os.path.exists(f"/proc/self/fd/{fd}")
    ]
    assert not [target for target in leaked if "/dev/shm/torch_" in target], leaked
    assert not tensor.is_shared()
