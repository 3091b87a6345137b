"""A linear layer whose weight stays packed in ggml blocks, compiled for the CPU
(kernels/cpu/quant_linear.cpp).

`packed` is uint8 [N, row_bytes]: each output row's K weights as the GGUF file stores them
(kernels/quant_formats.py). Each block is decoded in registers to fp32 weights (exactly gguf's
values, up to one fused rounding of `d * q + m`), so the result is `F.linear` on the
dequantized weight with fp32 sums, rounded once to x's dtype: within fp32 summation-order error
(relative ~1e-6) for float32 x, one bf16 rounding (2^-8 relative) for bfloat16 x.

    q4_0 q4_1 q8_0, up to MAX_BLOCKED_ROWS rows   register-blocked, tiles of 8 rows of x;
    (any number with int8_activations)            batch invariant (below); x in fp32, or with
                                                  int8_activations rounded per block of 32 to
                                                  int8 and multiplied in int8 (the other paths
                                                  then take x rounded so, in fp32)
    q8_0x16 q4_0x16 q4_1x16 q4_kx16 q6_kx16,      the same blocks interleaved by 16 rows
    as many rows as above                         (quant_formats.py): one row per vector
                                                  lane, otherwise as above (the K-quants'
                                                  rows past the last group: one padded group)
    q4_k q6_k, up to MAX_ROWS rows                the packed bytes streamed once for all rows
    more rows (prefill in fp32)                   a tile of weight rows that fits L2 decoded to
                                                  fp32, one sgemm per tile

With int8 activations the blocked kernels take prefill chunks of any length: multiplying in
int8 outruns the fp32 sgemm there (2.2x for q4_kx16, 2.6x for q4_1x16 at 512 rows; docs/
benchmarks.md).

Batch invariant: for q4_0, q4_1, q8_0 and their interleaved forms with up to `MAX_BLOCKED_ROWS`
rows (any number with int8 activations), each output is summed in one fixed order whatever the
number of rows, by the kernels the fused decode ops (kernels/decode_layer.py) run too; a row of
x gives the same bits alone, in a batch of 40 or through `decode_linear`, so a request's tokens
do not depend on the requests batched with it.
The torch twin is `radixflow.kernels.reference.quant_linear_ref`.
"""

from __future__ import annotations

import torch

from radixflow.kernels.cpu_build import cpu_kernels_available
from radixflow.kernels.quant_formats import BLOCKED_QTYPES, MAX_BLOCKED_ROWS, QTYPES, check_packed

__all__ = [
    "DTYPES",
    "BLOCKED_QTYPES",
    "MAX_BLOCKED_ROWS",
    "MAX_ROWS",
    "QTYPES",
    "check_quant_linear_args",
    "quant_linear",
    "quant_linear_available",
]

MAX_ROWS = 8  # q4_k, q6_k: rows of x taken by the streaming matvec; more go to the sgemm
DTYPES = (torch.float32, torch.bfloat16)


def quant_linear_available() -> bool:
    """True when the compiled kernel is loaded (built on the first call of the process)."""
    return cpu_kernels_available()


def quant_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    qtype: str,
    k: int,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    int8_activations: bool = False,
) -> torch.Tensor:
    """`F.linear(x, W, bias)` for W [N, K] packed as `qtype` blocks; returns [M, N] (out).

    x [M, K] (M may be 0), bias [N] and out share one dtype, float32 or bfloat16, on the CPU; x and
    out need only a contiguous last dim. `int8_activations`: x is rounded per block of 32 to
    int8 (`quant_formats.quantize_activations`), as llama.cpp's q8 activations; the blocked
    qtypes then multiply in int8 (faster) at any number of rows, the K-quants' plain layout
    multiplies the rounded x in fp32, so that every path gives one result.
    """
    if not quant_linear_available():
        raise RuntimeError("the CPU quantized linear kernel is not available on this machine")
    if x.device.type != "cpu":
        raise ValueError(f"the CPU quantized linear kernel takes CPU tensors, got x on {x.device}")
    out = check_quant_linear_args(x, packed, qtype, k, bias, out, DTYPES)
    if bias is not None and not bias.is_contiguous():
        raise ValueError("bias must be contiguous")
    if x.shape[0] == 0:  # a step with no logits rows
        return out
    torch.ops.radixflow_cpu.quant_linear(
        x if x.stride(-1) == 1 else x.contiguous(), packed, qtype, k, bias, out, int8_activations
    )
    return out


def check_quant_linear_args(
    x: torch.Tensor,
    packed: torch.Tensor,
    qtype: str,
    k: int,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    dtypes: tuple[torch.dtype, ...],
) -> torch.Tensor:
    """The checks every quantized linear shares (CPU and Triton); returns `out`, allocated when
    None. x [M, K] in one of `dtypes`; bias [N] and out [M, N] in x's dtype on x's device, out
    with a contiguous last dim."""
    check_packed(packed, qtype, k)
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be [M, {k}], got {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"x must be one of {dtypes}, got {x.dtype}")
    n = packed.shape[0]
    if bias is not None and (bias.shape != (n,) or bias.dtype != x.dtype):
        raise ValueError(f"bias must be [{n}] {x.dtype}, got {tuple(bias.shape)} {bias.dtype}")
    if packed.device != x.device or (bias is not None and bias.device != x.device):
        raise ValueError(
            f"x, packed and bias must be on one device, got {x.device} and {packed.device}"
        )
    shape = (x.shape[0], n)
    if out is None:
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    if out.shape != shape or out.dtype != x.dtype or out.device != x.device or out.stride(-1) != 1:
        raise ValueError(
            f"out must be a {x.dtype} tensor of shape {shape} on {x.device} with a contiguous "
            f"last dim, got {tuple(out.shape)} {out.dtype} on {out.device}"
        )
    return out
