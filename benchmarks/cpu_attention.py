"""The compiled CPU decode-attention kernel against the gather + SDPA path, in one run.

    python benchmarks/cpu_attention.py [--quick]

Times one decode step of TorchPagedBackend.forward for one layer (writing the new K/V, then
attention) with the kernel and without it (use_kernel=False: K/V gathered through req_to_token,
padded, torch SDPA), for batches 1/16/64 at contexts 128/512/2048 in bfloat16 and float32, with
the default model's attention shape (9 query heads, 3 KV heads, head dim 64) on scattered pages
of 16 tokens. Layers are cycled so the K/V read does not sit in the last-level cache, as in a
30-layer model. A second table times rows sharing a cached prefix: the cascade path (prefix
attended once by SDPA, tails by the kernel) against the kernel over whole sequences, and
against the SDPA path with cascade. Each figure is the median of several repeats.
"""

from __future__ import annotations

import argparse
import math

import torch
from common import median_time, print_table

from radixflow.kernels.cpu_attention import cpu_decode_attention_available
from radixflow.runtime.attention.base import AttentionLayerSpec
from radixflow.runtime.attention.sdpa_backend import TorchPagedBackend
from radixflow.runtime.forward_batch import ForwardBatch, ForwardMode
from radixflow.runtime.kv_pool import KVPool

HEADS, KV_HEADS, HEAD_DIM, PAGE = 9, 3, 64, 16
CACHE_DEFEAT_BYTES = 96 * 2**20  # K/V read per cycle of layers: well above the L3 cache


class Setup:
    """Requests of given lengths on a pool of scattered pages; the first `shared` tokens of
    every request are the same slots (a radix-cache hit) when shared > 0."""

    def __init__(self, dtype: torch.dtype, lengths: list[int], shared: int = 0) -> None:
        tokens = sum(lengths) - shared * (len(lengths) - 1) + PAGE * len(lengths)
        per_layer = 2 * tokens * KV_HEADS * HEAD_DIM * dtype.itemsize
        self.num_layers = max(1, min(8, math.ceil(CACHE_DEFEAT_BYTES / per_layer)))
        self.pool = KVPool(
            num_layers=self.num_layers, num_pages=tokens // PAGE + len(lengths) + 2,
            page_size=PAGE, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype=dtype,
            device="cpu", max_reqs=len(lengths), max_context=max(lengths) + 1,
        )  # fmt: skip
        for buf in self.pool.k_buffers + self.pool.v_buffers:
            buf.normal_()
        gen = torch.Generator().manual_seed(0)
        pages = self.pool.alloc_pages(self.pool.available())
        order = torch.randperm(len(pages), generator=gen).tolist()
        self.pool.free_pages([pages[j] for j in order])
        common = self.pool.slots_of_pages(self.pool.alloc_pages(shared // PAGE))
        rows, new_slots = [], []
        for n in lengths:
            row = self.pool.alloc_row()
            own = self.pool.slots_of_pages(self.pool.alloc_pages(math.ceil((n - shared) / PAGE)))
            slots = torch.cat([common, own])[:n]
            self.pool.req_to_token[row, :n] = slots.int()
            rows.append(row)
            new_slots.append(slots[-1:])
        b = len(lengths)
        ones = torch.ones(b, dtype=torch.int64)
        self.batch = ForwardBatch(
            mode=ForwardMode.DECODE, input_ids=torch.zeros(b, dtype=torch.int64),
            positions=torch.tensor(lengths) - 1, out_cache_loc=torch.cat(new_slots),
            req_to_token=self.pool.req_to_token, req_pool_indices=torch.tensor(rows),
            seq_lens=torch.tensor(lengths), prefix_lens=torch.tensor(lengths) - 1,
            extend_lens=ones, seq_lens_cpu=list(lengths),
            prefix_lens_cpu=[n - 1 for n in lengths], extend_lens_cpu=[1] * b,
            logits_indices=torch.arange(b),
        )  # fmt: skip
        self.q = torch.randn(b, HEADS * HEAD_DIM, generator=gen).to(dtype)
        self.kv = torch.randn(b, KV_HEADS * HEAD_DIM, generator=gen).to(dtype)

    def step_time(self, backend: TorchPagedBackend, repeats: int) -> float:
        """Median seconds of one layer's forward, the layers taken in turn."""
        backend.init_forward_metadata(self.batch)
        specs = [
            AttentionLayerSpec(i, HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5)
            for i in range(self.num_layers)
        ]

        def cycle() -> None:
            for spec in specs:
                backend.forward(self.q, self.kv, self.kv, spec, self.batch)

        return median_time(cycle, repeats=repeats) / self.num_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    args = parser.parse_args()
    if not cpu_decode_attention_available():
        raise SystemExit("the CPU attention kernel did not build on this machine")
    repeats = 3 if args.quick else 9
    print(f"threads: {torch.get_num_threads()}; times per layer in ms, median of {repeats}")
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for batch in (1, 16, 64):
            for context in (128, 512, 2048):
                setup = Setup(dtype, [context] * batch)
                sdpa = setup.step_time(TorchPagedBackend(setup.pool, use_kernel=False), repeats)
                kernel = setup.step_time(TorchPagedBackend(setup.pool), repeats)
                gb_s = 2 * batch * context * KV_HEADS * HEAD_DIM * dtype.itemsize / kernel / 1e9
                rows.append(
                    [str(dtype).removeprefix("torch."), batch, context, f"{sdpa * 1e3:.3f}",
                     f"{kernel * 1e3:.3f}", f"{sdpa / kernel:.1f}x", f"{gb_s:.1f}"]
                )  # fmt: skip
    print_table(
        ["dtype", "batch", "context", "gather+SDPA", "kernel", "speed-up", "K/V GB/s"], rows
    )

    print("\nrows sharing a cached prefix (tails of 32 tokens), ms per layer:")
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for batch, prefix in ((16, 512), (64, 512), (16, 2048)):
            setup = Setup(dtype, [prefix + 32] * batch, shared=prefix)
            times = [
                setup.step_time(TorchPagedBackend(setup.pool, use_kernel=k, cascade=c), repeats)
                for k, c in ((True, True), (True, False), (False, True))
            ]
            rows.append(
                [str(dtype).removeprefix("torch."), batch, prefix]
                + [f"{t * 1e3:.3f}" for t in times]
            )
    print_table(
        ["dtype", "batch", "prefix", "kernel+cascade", "kernel, no cascade", "SDPA+cascade"],
        rows,
    )


if __name__ == "__main__":
    main()
