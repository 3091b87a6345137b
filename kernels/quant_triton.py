"""W8A16 / W4A16 matmul over ggml-packed weights (q8_0, q4_0, q4_1) in Triton.

`packed` is uint8 [N, row_bytes] as a GGUF file stores it (kernels/quant_formats.py); each
program owns a [BLOCK_M, BLOCK_N] tile of y and walks K one 32-weight block at a time:

    x tile [BLOCK_M, 32]          w tile [32, BLOCK_N] from BLOCK_N packed blocks (34/18/20 B):
                                  fp16 d (and m) from two bytes, q from bytes/nibbles,
    acc += dot(x, d * q (+ m))    dequantized to x's dtype (fp32 for fp32 x), fp32 accumulation

The fp16 scales sit at even byte offsets of each block, so they are read as two bytes and
bitcast. Reference: kernels/reference.py `quant_linear_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.quant_formats import quant_format
from radixflow.kernels.quant_linear import check_quant_linear_args

QTYPES = ("q8_0", "q4_0", "q4_1")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_QTYPE_CODES = {name: i for i, name in enumerate(QTYPES)}


@triton.jit
def _f16_at(ptr, mask):
    """The little-endian fp16 at `ptr` (uint8 pointers) as float32."""
    lo = tl.load(ptr, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _quant_matmul_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr,
    M, N, K, stride_xm, stride_ym, row_bytes,
    QTYPE: tl.constexpr, BLOCK_BYTES: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    kk = tl.arange(0, 32)
    rows = w_ptr + offs_n.to(tl.int64)[None, :] * row_bytes  # [1, BLOCK_N]
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, K // 32):
        x = tl.load(x_rows + kb * 32 + kk[None, :], mask=mask_m[:, None], other=0.0)
        block = rows + kb * BLOCK_BYTES
        d = _f16_at(block, mask_n[None, :])
        if QTYPE == 0:  # q8_0: int8 q, w = d * q
            q = tl.load(block + 2 + kk[:, None], mask=mask_n[None, :], other=0)
            w = q.to(tl.int8, bitcast=True).to(tl.float32) * d
        else:  # q4_x: weight i in the low nibble of byte i, weight i + 16 in the high one
            start = 2 if QTYPE == 1 else 4
            byte = tl.load(block + start + (kk % 16)[:, None], mask=mask_n[None, :], other=0)
            q = ((byte.to(tl.int32) >> ((kk // 16) * 4)[:, None]) & 0x0F).to(tl.float32)
            # q4_0: w = d * (q - 8); q4_1: w = d * q + m
            w = (q - 8.0) * d if QTYPE == 1 else q * d + _f16_at(block + 2, mask_n[None, :])
        acc += tl.dot(x, w.to(x.dtype), input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def quant_linear_triton(
    x: torch.Tensor,
    packed: torch.Tensor,
    qtype: str,
    k: int,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`F.linear(x, W, bias)` for W [N, K] packed as q8_0 / q4_0 / q4_1 blocks; returns [M, N].

    x [M, K] (float16, bfloat16 or float32), bias [N] and out share x's dtype and device; W is
    dequantized to x's dtype in registers and products are summed in fp32.
    """
    fmt = quant_format(qtype)
    if qtype not in QTYPES:
        raise ValueError(f"the Triton quantized matmul takes {list(QTYPES)}, got {qtype!r}")
    out = check_quant_linear_args(x, packed, qtype, k, bias, out, DTYPES)
    if x.shape[0] == 0:  # a step with no logits rows
        return out
    n = packed.shape[0]
    x = x if x.stride(1) == 1 else x.contiguous()
    block_m = 16 if x.shape[0] <= 16 else 64
    block_n = 64
    grid = (triton.cdiv(x.shape[0], block_m), triton.cdiv(n, block_n))
    _quant_matmul_kernel[grid](
        x, packed, bias if bias is not None else x, out,
        x.shape[0], n, k, x.stride(0), out.stride(0), packed.shape[1],
        QTYPE=_QTYPE_CODES[qtype], BLOCK_BYTES=fmt.block_bytes, HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n,
    )  # fmt: skip
    return out
