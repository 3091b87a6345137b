"""Shared pieces of the benchmark scripts: machine rooflines and table printing."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import torch


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def memory_bandwidth() -> float:
    """Bytes/s the memory delivers, the batch-1 decode roofline: the faster of reading 256 MiB
    (a dot product of a tensor with itself) and copying it (read + write counted). Both tensors
    are written first: a page never written reads as the kernel's shared zero page, which stays
    in cache (a copy from one measured 32.5 GB/s where the same copy from written memory
    measured 25.5 GB/s)."""
    src = torch.ones(64 * 2**20, dtype=torch.float32)
    dst = torch.zeros_like(src)
    nbytes = src.numel() * src.element_size()
    read = nbytes / median_time(lambda: torch.dot(src, src))
    copy = 2 * nbytes / median_time(lambda: dst.copy_(src))
    return max(read, copy)


def matmul_rate(dtype: torch.dtype, m: int = 2048, k: int = 2048, n: int = 2048) -> float:
    """FLOP/s of an m x k @ k x n matmul in dtype."""
    a = torch.randn(m, k, dtype=dtype)
    b = torch.randn(k, n, dtype=dtype)
    seconds = median_time(lambda: a @ b, repeats=3)
    return 2 * m * k * n / seconds


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    cells = [[str(c) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True)) + " |"
    print(line)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (inclusive method); nan for no values."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


# the serving benchmark's prompt vocabulary (its seeded prompts depend on this exact list)
SERVING_WORDS = (
    "the of and to in is was for on are with as by at from this that have be it not or his "
    "her they we you all were when which their said there would about time into has more "
    "river mountain city garden engine story music letter window market winter summer light"
).split()


def passage(rng: random.Random, words: int) -> str:
    """Seeded filler prose of `words` words (for prompts whose content does not matter)."""
    vocab = (
        "the of and a to in is was it for on with as by at from that this which be are an "
        "river mountain city old new water light stone bridge forest long small great north "
        "south people built years ago known famous across between above under during"
    ).split()
    return " ".join(rng.choice(vocab) for _ in range(words)).capitalize() + "."
