"""A linear layer for a few rows compiled for the CPU (kernels/cpu/small_linear.cpp).

Decoding (one row per request) or verifying k+1 speculative tokens multiplies a handful of
activation rows by every weight matrix; that is bound by reading the weights, and torch's
`F.linear` streams them at a fraction of the memory bandwidth for such shapes. The kernel reads
each weight row once for all (at most `MAX_ROWS`) rows of x, with fp32 accumulation. It is
built with the other CPU kernels by `radixflow.kernels.cpu_build` for the best ISA this CPU
runs (AVX-512, with VDPBF16PS for bfloat16 where the CPU has AVX512-BF16; AVX2; NEON); the
torch twin is `radixflow.kernels.reference.linear_ref`.
"""

from __future__ import annotations

import torch

from radixflow.kernels.cpu_build import cpu_kernels_available

MAX_ROWS = 8
DTYPES = (torch.float32, torch.bfloat16)


def small_linear_available() -> bool:
    """True when the compiled kernel is loaded (built on the first call of the process)."""
    return cpu_kernels_available()


def small_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x [M, K] with 1 <= M <= MAX_ROWS; returns [M, N] (out).

    x, weight [N, K], bias [N] and out share one dtype, float32 or bfloat16, and live on the
    CPU; sums are fp32 and rounded once to the dtype, as torch does. x and out need only a
    contiguous last dim.
    """
    if not small_linear_available():
        raise RuntimeError("the CPU linear kernel is not available on this machine")
    _check_args(x, weight, bias)
    shape = (x.shape[0], weight.shape[0])
    if out is None:
        out = torch.empty(shape, dtype=x.dtype)
    elif (
        out.shape != shape
        or out.dtype != x.dtype
        or out.device.type != "cpu"
        or out.stride(-1) != 1
    ):
        raise ValueError(
            f"out must be a CPU {x.dtype} tensor of shape {shape} with a contiguous last dim, got "
            f"{tuple(out.shape)} {out.dtype} on {out.device}"
        )
    torch.ops.radixflow_cpu.small_linear(
        x if x.stride(-1) == 1 else x.contiguous(), weight, bias, out
    )
    return out


def _check_args(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"expected x [M, K] and weight [N, K], got x {tuple(x.shape)}, "
            f"weight {tuple(weight.shape)}"
        )
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"x must have 1 to {MAX_ROWS} rows, got {x.shape[0]}")
    if x.dtype not in DTYPES or weight.dtype != x.dtype:
        raise ValueError(
            f"x and weight must share one dtype of {DTYPES}, got {x.dtype}, {weight.dtype}"
        )
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != x.dtype):
        raise ValueError(
            f"bias must be [{weight.shape[0]}] {x.dtype}, got {tuple(bias.shape)} {bias.dtype}"
        )
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if any(t.device.type != "cpu" for t in tensors):
        raise ValueError("the CPU linear kernel takes CPU tensors only")
    if not weight.is_contiguous() or (bias is not None and not bias.is_contiguous()):
        raise ValueError("weight and bias must be contiguous")
