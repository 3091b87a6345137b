"""Helpers shared by the kernel tests and benchmarks: random paged tables and a relative error."""

from __future__ import annotations

import math

import torch

from radixflow.kernels.quant_formats import INTERLEAVED, interleave_rows


def random_paged_table(
    seq_lens: list[int],
    page_size: int,
    gen: torch.Generator,
    max_reqs: int = 8,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A req_to_token table whose requests sit on randomly chosen, non-contiguous pages.

    Page 0 is never used (the pool reserves it). Rows are random and distinct. Returns
    (req_to_token [max_reqs, max_context] int32, req_pool_indices [B] int64, number of slots).
    """
    if len(seq_lens) > max_reqs:
        raise ValueError(f"{len(seq_lens)} requests do not fit in {max_reqs} rows")
    pages_each = [math.ceil(n / page_size) for n in seq_lens]
    num_pages = 2 * sum(pages_each) + 2
    pages = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    max_context = max(pages_each, default=0) * page_size + 3
    req_to_token = torch.zeros((max_reqs, max_context), dtype=torch.int32)
    rows = torch.randperm(max_reqs, generator=gen)[: len(seq_lens)]
    for row, n_pages in zip(rows.tolist(), pages_each, strict=True):
        mine = torch.tensor([pages.pop() for _ in range(n_pages)], dtype=torch.int64)
        slots = (mine[:, None] * page_size + torch.arange(page_size)).reshape(-1)
        req_to_token[row, : slots.numel()] = slots.int()
    return req_to_token.to(device), rows.to(device), num_pages * page_size


def random_gguf_weight(
    qtype: str, n: int, k: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid random GGUF blocks for an [n, k] weight: (packed uint8 [n, row bytes], gguf's own
    dequantization float32 [n, k]). q8_0/q4_x quantize a random weight with gguf; q4_k/q6_k
    blocks are random bytes whose fp16 scales are set to small finite values; the interleaved
    qtypes (q8_0x16, ...) are their plain blocks interleaved (quant_formats.interleave_rows)."""
    import gguf.quants

    if qtype in INTERLEAVED:
        packed, w = random_gguf_weight(INTERLEAVED[qtype], n, k, gen)
        return interleave_rows(packed, INTERLEAVED[qtype]), w
    kind = gguf.GGMLQuantizationType[qtype.upper()]
    if kind in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K):
        block, size = gguf.GGML_QUANT_SIZES[kind]
        raw = torch.randint(0, 256, (n, k // block, size), dtype=torch.uint8, generator=gen)
        scales = (torch.rand(n, k // block, 2, generator=gen) * 0.01).half().view(torch.uint8)
        at = [0, 2] if kind == gguf.GGMLQuantizationType.Q4_K else [size - 2]
        for i, offset in enumerate(at):
            raw[:, :, offset : offset + 2] = scales[:, :, 2 * i : 2 * i + 2]
        packed = raw.reshape(n, -1)
    else:
        w = torch.randn(n, k, generator=gen) * k**-0.5
        packed = torch.from_numpy(gguf.quants.quantize(w.numpy(), kind))
    return packed, torch.from_numpy(gguf.quants.dequantize(packed.numpy(), kind).copy()).float()


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|, in fp32; NaN in out gives NaN."""
    diff = (out.float() - ref.float()).abs().max()
    return float(diff / ref.float().abs().max().clamp_min(1e-30))
