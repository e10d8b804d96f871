"""Keep the C heap's freed memory for the next step instead of handing it back to the kernel.

glibc's malloc serves a block over its mmap threshold (128 KiB at first) with a fresh mmap and
unmaps it when it is freed, and it trims the heap's free top back to the kernel. A training step
allocates and frees the same activations every time: the classic conv net's first layer alone
makes 1.5 MB tensors, and a worker took 400-1,000 page faults a step, about a quarter of its
time (docs/performance.md). Raising both thresholds once per process keeps those pages mapped,
so every step after the first reuses them: no fault, no zeroing by the kernel.

The cost is memory that stays with the process: at most `TRIM` bytes of free heap top, plus
blocks up to `MMAP` bytes that now live in the heap. Other C libraries (musl, macOS, jemalloc or
tcmalloc through LD_PRELOAD) are left alone.
"""

from __future__ import annotations

import ctypes

MMAP = 32 << 20  # blocks under this come from the heap (glibc's largest allowed value on 64-bit)
TRIM = 64 << 20  # free heap top kept before trimming
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds in this process; False where there is no glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the symbols this process already has
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM))
