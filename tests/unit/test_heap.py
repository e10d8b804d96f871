"""A step's freed activations stay with the process for the next step (glibc), instead of
being unmapped at every free and faulted back in at the next allocation."""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch

from hogwild import heap

FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


class MallInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS.split()]  # <malloc.h> mallinfo2


def mallinfo() -> MallInfo:
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc older than 2.33 has no mallinfo2")
    libc.mallinfo2.restype = MallInfo
    return libc.mallinfo2()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux only")
def test_a_large_block_comes_from_the_heap_and_stays_there_once_freed():
    # glibc's defaults map a fresh 24 MiB block with mmap and unmap it at free
    assert heap.keep_freed_memory()
    nbytes = 24 << 20
    before = mallinfo()
    block = torch.empty(nbytes // 4).fill_(1.0)
    assert mallinfo().hblkhd == before.hblkhd, "the block was mapped on its own"
    del block
    assert mallinfo().fordblks >= nbytes, "the freed block went back to the kernel"
