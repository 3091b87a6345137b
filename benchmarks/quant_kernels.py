"""The CPU quantized linear (GGUF blocks kept packed) against fp32 F.linear, in one run.

    python benchmarks/quant_kernels.py [--repeats 7] [--threads N] [--rows 1 8 16 32 64] \
        [--int8-activations] [--model smollm2-135m|llama-3.2-1b]

For the default model's (SmolLM2-135M) matrix shapes, N x K: o_proj 576x576, gate/up 1536x576,
down 576x1536 and the tied lm_head 49152x576 (`--model llama-3.2-1b`: a 1B model's 2048x2048,
8192x2048 and 2048x8192, whose K takes every qtype, K-quants included), and M rows of x (1: batch-1 decode; 8: the fused
decode ops' largest batch; 16-64: continuous batching, the batch-invariant register-blocked
kernel for q4_0/q4_1/q8_0): the median time of one matrix for torch's F.linear on the weight
dequantized to fp32 at load (what `--quantization none` runs) and for `quant_linear` on each
qtype (K-quants need K a multiple of 256: down only; q8_0x16, q4_0x16, q4_1x16 and q4_kx16
are the layouts the CPU kernels store q8_0, q4_0, q4_1 and q4_k in once loaded: interleaved by
16 rows), the
weight bytes read per second (packed bytes for the kernel, fp32 bytes for F.linear) and the
speedup; `--int8-activations` runs the kernel with x rounded to int8 per block of 32. Each layer shape is timed over
30 distinct copies, as the model's 30 layers (4 of the 1B model's larger ones), so the weights
stream from memory rather than sit in cache; the lm_head is one matrix. Kernel and F.linear run in turn in every repeat (same
load). The header gives this machine's memory bandwidth (`common.memory_bandwidth`) as the roofline for M = 1.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from common import memory_bandwidth, print_table
from cpu_linear import paired_medians

from radixflow.kernels.quant_formats import quant_format
from radixflow.kernels.quant_linear import QTYPES, quant_linear, quant_linear_available
from radixflow.kernels.testing import random_gguf_weight

# model -> (copies of each layer shape, its shapes: name, N, K)
MODELS = {
    "smollm2-135m": (
        30,
        [
            ("o_proj", 576, 576),
            ("gate/up", 1536, 576),
            ("down", 576, 1536),
            ("lm_head", 49152, 576),
        ],
    ),
    "llama-3.2-1b": (4, [("q/o_proj", 2048, 2048), ("gate/up", 8192, 2048), ("down", 2048, 8192)]),
}


def shape_rows(
    name: str, n: int, k: int, layers: int, rows_list: list[int], repeats: int, int8: bool
) -> list[list[object]]:
    copies = 1 if name == "lm_head" else layers
    gen = torch.Generator().manual_seed(n + k)
    dense = [torch.randn(n, k, generator=gen) * k**-0.5 for _ in range(copies)]
    packed = {}
    for qtype in QTYPES:
        if k % quant_format(qtype).block_size == 0:
            one, _ = random_gguf_weight(qtype, n, k, gen)
            packed[qtype] = [one.clone() for _ in range(copies)]
    table: list[list[object]] = []
    for rows in rows_list:
        x = torch.randn(rows, k, generator=gen)
        fns = [lambda x=x: [F.linear(x, w) for w in dense]]
        fns += [
            lambda x=x, q=q, ws=ws: [quant_linear(x, w, q, k, int8_activations=int8) for w in ws]
            for q, ws in packed.items()
        ]
        seconds = paired_medians(fns, repeats)
        base = seconds[0]
        labels = ["F.linear fp32", *packed]
        weights = [dense, *packed.values()]
        for label, ws, sec in zip(labels, weights, seconds, strict=True):
            nbytes = ws[0].numel() * ws[0].element_size()
            per = sec / copies
            table.append(
                [f"{name} {n}x{k}", rows, label, f"{per * 1e3:.3f}", f"{nbytes / 2**20:.2f}",
                 f"{nbytes / per / 1e9:.1f}", f"{base / sec:.2f}x"]
            )  # fmt: skip
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    parser.add_argument("--int8-activations", action="store_true")
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2-135m")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not quant_linear_available():
        raise SystemExit("the CPU quantized linear kernel is not available on this machine")
    print(
        f"threads: {torch.get_num_threads()}; memory bandwidth: {memory_bandwidth() / 1e9:.1f} GB/s"
    )
    layers, shapes = MODELS[args.model]
    table = [
        r
        for name, n, k in shapes
        for r in shape_rows(name, n, k, layers, args.rows, args.repeats, args.int8_activations)
    ]
    headers = ["matrix", "M", "weights", "ms/matrix", "MiB", "GB/s", "vs F.linear"]
    print_table(headers, table)


if __name__ == "__main__":
    main()
