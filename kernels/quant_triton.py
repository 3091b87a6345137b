"""W8A16 / W4A16 matmul over ggml-packed weights (q8_0, q4_0, q4_1) in Triton.

`packed` is uint8 [N, row_bytes] as a GGUF file stores it (kernels/quant_formats.py). A program
owns a [BLOCK_M, BLOCK_N] tile of y and one share of K, walking it one 32-weight block at a
time. With few rows (up to SCALE_AFTER_DOT_MAX_ROWS; q8_0 and q4_0) the block's integer codes
go into the dot product as they are and its scale applies once to the block's partial sums;
otherwise the block's weights are dequantized once for all the tile's rows:

    few rows   acc += dot(x[:, block], q) * d         q [32, BLOCK_N]: int8 (q8_0) or nibbles
                                                      - 8 (q4_0), exact in x's dtype; fp16 d
    otherwise  acc += dot(x[:, block], d * q (+ m))   the weights rounded to x's dtype (q4_1
                                                      adds its fp16 m)

Few rows leave most of the GPU idle with one program per column tile, so K is split over
`split_k` programs per tile (a power of two, from the device's SM count); they write fp32
partial tiles that a second kernel sums in a fixed order, with the bias, into y.

The fp16 scales sit at even byte offsets of each block, so they are read as two bytes and
bitcast. Reference: kernels/reference.py `quant_linear_ref`.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from radixflow.kernels.quant_formats import quant_format
from radixflow.kernels.quant_linear import check_quant_linear_args

QTYPES = ("q8_0", "q4_0", "q4_1")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_QTYPE_CODES = {name: i for i, name in enumerate(QTYPES)}
MIN_BLOCKS_PER_SPLIT = 8  # a share of K shorter than this costs more in partials than it saves
MAX_SPLIT_K = 32
PROGRAMS_PER_MULTIPROCESSOR = 8  # split K until the grid has this many
# Up to this many rows a q8_0/q4_0 block's scale multiplies its partial sums; past it (and for
# q4_1, whose min would need x's block sums) the [32, BLOCK_N] weights are dequantized once for
# all BLOCK_M rows: on an H200 that is up to 2x faster at 32+ rows and 1-7% slower at 1-16.
SCALE_AFTER_DOT_MAX_ROWS = 16


@triton.jit
def _f16_at(ptr, mask):
    """The little-endian fp16 at `ptr` (uint8 pointers) as float32."""
    lo = tl.load(ptr, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _quant_matmul_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr,
    M, N, stride_xm, stride_ym, row_bytes, blocks_per_split, num_blocks,
    QTYPE: tl.constexpr, BLOCK_BYTES: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr, SCALE_AFTER_DOT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k16 = tl.arange(0, 16)
    rows = w_ptr + offs_n.to(tl.int64)[None, :] * row_bytes  # [1, BLOCK_N]
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first = pid_k * blocks_per_split
    last = tl.minimum(first + blocks_per_split, num_blocks)
    for kb in range(first, last):
        # x's block as its first and second 16 values (q4's low and high nibbles)
        x_lo = tl.load(x_rows + kb * 32 + k16[None, :], mask=mask_m[:, None], other=0.0)
        x_hi = tl.load(x_rows + kb * 32 + 16 + k16[None, :], mask=mask_m[:, None], other=0.0)
        block = rows + kb * BLOCK_BYTES
        d = _f16_at(block, mask_n[None, :])
        if QTYPE == 0:  # q8_0: int8 q, w = d * q
            q_lo = tl.load(block + 2 + k16[:, None], mask=mask_n[None, :], other=0)
            q_hi = tl.load(block + 18 + k16[:, None], mask=mask_n[None, :], other=0)
            q_lo = q_lo.to(tl.int8, bitcast=True)
            q_hi = q_hi.to(tl.int8, bitcast=True)
        else:  # q4_x: weight i in the low nibble of byte i, weight i + 16 in the high one
            byte = tl.load(block + (2 if QTYPE == 1 else 4) + k16[:, None], mask=mask_n[None, :],
                           other=0)  # fmt: skip
            q_lo = (byte & 0x0F).to(tl.int8)
            q_hi = (byte >> 4).to(tl.int8)
            if QTYPE == 1:  # q4_0: w = d * (q - 8)
                q_lo -= 8
                q_hi -= 8
        if SCALE_AFTER_DOT:  # few rows (q8_0, q4_0): the block's scale once per column
            part = tl.dot(x_lo, q_lo.to(x_lo.dtype), input_precision="ieee")
            part = tl.dot(x_hi, q_hi.to(x_hi.dtype), part, input_precision="ieee")
            acc += part * d
        else:  # many rows: the weights dequantized once for all of them
            w_lo = q_lo.to(tl.float32) * d
            w_hi = q_hi.to(tl.float32) * d
            if QTYPE == 2:  # q4_1: w = d * q + m
                m = _f16_at(block + 2, mask_n[None, :])
                w_lo += m
                w_hi += m
            acc = tl.dot(x_lo, w_lo.to(x_lo.dtype), acc, input_precision="ieee")
            acc = tl.dot(x_hi, w_hi.to(x_hi.dtype), acc, input_precision="ieee")
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT:  # an fp32 partial tile; _sum_splits_kernel adds the shares
        y = y_ptr + (pid_k * M + offs_m.to(tl.int64))[:, None] * N + offs_n[None, :]
        tl.store(y, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        y = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sum_splits_kernel(
    part_ptr, bias_ptr, y_ptr, M, N, stride_ym,
    SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in range(SPLITS):  # a fixed order: the same bits on every run
        acc += tl.load(part_ptr + (s * M + row).to(tl.int64) * N + offs_n, mask=mask_n, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(y_ptr + row.to(tl.int64) * stride_ym + offs_n, acc.to(y_ptr.dtype.element_ty),
             mask=mask_n)  # fmt: skip


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter: nothing to fill
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_split_k(tiles: int, num_blocks: int, device: torch.device) -> int:
    """Shares of K per output tile: the smallest power of two that gives every multiprocessor
    PROGRAMS_PER_MULTIPROCESSOR programs, while each share keeps MIN_BLOCKS_PER_SPLIT blocks."""
    want = PROGRAMS_PER_MULTIPROCESSOR * _multiprocessors(device)
    split = 1
    while (
        tiles * split < want
        and split < MAX_SPLIT_K
        and num_blocks // (2 * split) >= MIN_BLOCKS_PER_SPLIT
    ):
        split *= 2
    return split


def quant_linear_triton(
    x: torch.Tensor,
    packed: torch.Tensor,
    qtype: str,
    k: int,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    split_k: int | None = None,
) -> torch.Tensor:
    """`F.linear(x, W, bias)` for W [N, K] packed as q8_0 / q4_0 / q4_1 blocks; returns [M, N].

    x [M, K] (float16, bfloat16 or float32), bias [N] and out share x's dtype and device; each
    block's codes are multiplied in x's dtype (exact) and summed in fp32 with the block's scales.
    `split_k`: shares of K per output tile (None: `choose_split_k`).
    """
    fmt = quant_format(qtype)
    if qtype not in QTYPES:
        raise ValueError(f"the Triton quantized matmul takes {list(QTYPES)}, got {qtype!r}")
    out = check_quant_linear_args(x, packed, qtype, k, bias, out, DTYPES)
    if x.shape[0] == 0:  # a step with no logits rows
        return out
    m, n, num_blocks = x.shape[0], packed.shape[0], k // 32
    x = x if x.stride(1) == 1 else x.contiguous()
    block_m = 16 if m <= 16 else 64
    block_n = 64
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    split = choose_split_k(tiles, num_blocks, x.device) if split_k is None else split_k
    if split < 1:
        raise ValueError(f"split_k must be at least 1, got {split}")
    per_split = triton.cdiv(num_blocks, split)
    split = triton.cdiv(num_blocks, per_split)  # no share left empty
    has_bias = bias is not None
    scale_after_dot = qtype != "q4_1" and m <= SCALE_AFTER_DOT_MAX_ROWS
    target = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else out
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    _quant_matmul_kernel[grid](
        x, packed, bias if has_bias else x, target,
        m, n, x.stride(0), out.stride(0), packed.shape[1], per_split, num_blocks,
        QTYPE=_QTYPE_CODES[qtype], BLOCK_BYTES=fmt.block_bytes, HAS_BIAS=has_bias,
        SPLIT=split > 1, SCALE_AFTER_DOT=scale_after_dot, BLOCK_M=block_m, BLOCK_N=block_n,
    )  # fmt: skip
    if split > 1:
        sum_block = 256
        _sum_splits_kernel[(m, triton.cdiv(n, sum_block))](
            target, bias if has_bias else x, out, m, n, out.stride(0),
            SPLITS=split, HAS_BIAS=has_bias, BLOCK_N=sum_block,
        )  # fmt: skip
    return out
