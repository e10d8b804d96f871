"""A step's freed activations stay with the process for the next step (glibc), instead of
being unmapped at every free and faulted back in at the next allocation."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# In a fresh interpreter (glibc adapts its thresholds to what a process has freed before, so
# only a fresh one shows its defaults): malloc a 24 MiB block, say whether it got a mapping of
# its own, free it, and say how much free memory the heap kept.
PROBE = textwrap.dedent(
    """
    import ctypes, sys
    from hogwild.worker import heap

    class MallInfo(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    if sys.argv[1] == "keep":
        assert heap.keep_freed_memory()
    size = 24 << 20
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    mapped = libc.mallinfo2().hblkhd > before
    libc.free(block)
    print(mapped, libc.mallinfo2().fordblks >= size)
    """
)


def probe(mode: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux only")
def test_a_large_block_comes_from_the_heap_and_stays_there_once_freed():
    assert probe("default") == "True False"  # glibc's defaults: its own mapping, unmapped at free
    assert probe("keep") == "False True"  # from the heap, and kept for the next step
