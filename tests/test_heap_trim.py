"""The server's periodic malloc_trim hands freed heap memory back to the OS."""

import ctypes
import gc

import pytest

from radixflow.runtime.server.heap import trim_heap


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(
    not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="this C library has no malloc_trim"
)
def test_trim_returns_freed_holes_to_the_os():
    # Freeing a large mmapped block raises glibc's mmap threshold, so the mid-size blocks below
    # come from the heap; freeing every other one leaves holes only malloc_trim returns.
    big = bytearray(8 * 2**20)
    del big
    blocks = [bytearray(b"x" * 600_000) for _ in range(400)]
    del blocks[::2]
    gc.collect()
    before = _rss_mib()
    assert trim_heap()
    assert before - _rss_mib() > 60  # of the ~114 MiB freed in holes
    del blocks
