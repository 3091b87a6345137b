"""Hand freed heap memory back to the OS while the server runs (glibc's `malloc_trim`).

glibc keeps what a process frees in its heaps. A server allocates transient buffers of every
size (a megabytes-long request body, a 40k-token id list, prefill activations, compiled
grammars evicted from their cache); once glibc's dynamic mmap threshold has risen, those come
from the heaps too and leave free holes that only `malloc_trim` returns. Without it, resident
memory creeps up under a mixed load although nothing leaks. Other C libraries (macOS, musl)
have no `malloc_trim`; there this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

TRIM_INTERVAL_S = 10.0


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _find_malloc_trim()


def trim_heap() -> bool:
    """Return the heaps' free pages to the OS; False where the C library cannot."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


async def trim_heap_periodically(interval: float = TRIM_INTERVAL_S) -> None:
    """Trim every `interval` seconds (off the event loop) until cancelled."""
    if _MALLOC_TRIM is None:
        logger.info("no malloc_trim in this C library: freed heap memory stays with the process")
        return
    while True:
        await asyncio.sleep(interval)
        await asyncio.to_thread(trim_heap)
