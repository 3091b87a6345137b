"""The compiled CPU small-row linear against F.linear on the default model's shapes, in one run.

    python benchmarks/cpu_linear.py [--repeats 7] [--threads N]

One "step" is every linear of a decode step of SmolLM2-135M for M token rows: 30 layers of
qkv (960x576), o (576x576), gate_up (3072x576) and down (576x1536), then the tied lm_head
(49152x576) with its output cast to float32. Each layer has its own weights, so they stream
from memory as in the model. For M = 1, 2, 4, 8 in bfloat16 and float32 the table gives the
median step time of the kernel and of F.linear (timed in turn in each repeat, so both see the
same load), the weight bytes read per second, and the speedup; the first row of each dtype is `tensor.sum()` over the same weights (a streaming
roofline for this machine at its current load).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from common import median_time, print_table

from radixflow.kernels.cpu_linear import small_linear, small_linear_available

LAYERS, HIDDEN, INTERMEDIATE, VOCAB = 30, 576, 1536, 49152
LAYER_SHAPES = [(960, HIDDEN), (HIDDEN, HIDDEN), (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]


def model_weights(dtype: torch.dtype) -> tuple[list[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    layers = [
        (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype)
        for _ in range(LAYERS)
        for n, k in LAYER_SHAPES
    ]
    return layers, (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02).to(dtype)


def step(fn, layers: list[torch.Tensor], head: torch.Tensor, rows: int) -> None:
    # Inputs are reused across layers: only the weight traffic matters here.
    xs = {k: torch.randn(rows, k).to(head.dtype) for k in (HIDDEN, INTERMEDIATE)}
    for w in layers:
        fn(xs[w.shape[1]], w)
    fn(xs[HIDDEN], head).float()


def paired_medians(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each fn, the fns run in turn in every repeat so that they see the
    same load on a shared machine."""
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(repeats):
        for fn, seen in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            seen.append(time.perf_counter() - start)
    return [statistics.median(seen) for seen in times]


def dtype_rows(dtype: torch.dtype, repeats: int) -> list[list[object]]:
    layers, head = model_weights(dtype)
    weights = [*layers, head]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    name = str(dtype).removeprefix("torch.")

    def row(rows: object, label: str, seconds: float, speedup: str) -> list[object]:
        return [name, rows, label, f"{seconds * 1e3:.1f}", f"{nbytes / seconds / 1e9:.1f}", speedup]

    table = [row("-", "sum()", median_time(lambda: [w.sum() for w in weights], repeats), "-")]
    for rows in (1, 2, 4, 8):
        kernel, torch_linear = paired_medians(
            [
                lambda fn=fn, rows=rows: step(fn, layers, head, rows)
                for fn in (small_linear, F.linear)
            ],
            repeats,
        )
        table.append(row(rows, "kernel", kernel, f"{torch_linear / kernel:.2f}x"))
        table.append(row(rows, "F.linear", torch_linear, "1.00x"))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not small_linear_available():
        raise SystemExit("the CPU linear kernel is not available on this machine")
    table = [
        r for dtype in (torch.bfloat16, torch.float32) for r in dtype_rows(dtype, args.repeats)
    ]
    print(f"threads: {torch.get_num_threads()}; weights per step: 134.5M parameters")
    print_table(["dtype", "M", "linear", "ms/step", "GB/s", "vs F.linear"], table)


if __name__ == "__main__":
    main()
