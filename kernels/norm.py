"""RMSNorm and the fused residual-add RMSNorm in Triton, with HF Llama's rounding convention.

    rms_norm(x, w)             y = (x / sqrt(mean(x^2) + eps)).to(x.dtype) * w      (stats in fp32)
    fused_add_rms_norm(x, r)   r <- (x + r) rounded to r's dtype;  x <- rms_norm(r, w)

The fused form equals the unfused `residual = x + residual; x = norm(residual)` of HF/SGLang/vLLM
decoder layers (the residual stream holds the rounded sum, and the norm reads that rounded sum).
References: kernels/reference.py `rms_norm_ref`, `fused_add_rms_norm_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.reference import check_norm_weight


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    out_ptr,
    residual_ptr,
    w_ptr,
    stride_x,
    stride_out,
    stride_res,
    eps,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    ADD_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if ADD_RESIDUAL:
        res = tl.load(residual_ptr + row * stride_res + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + res.to(tl.float32)).to(res.dtype)
        tl.store(residual_ptr + row * stride_res + offs, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, 0) / N + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    normed = (xf * inv_rms).to(out_ptr.dtype.element_ty)
    y = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _num_warps(n: int) -> int:
    return max(1, min(16, triton.next_power_of_2(n) // 256))


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """RMSNorm over the last dim of x [..., N]; returns a new tensor (or out) of x's shape/dtype."""
    check_norm_weight(x, weight)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    elif out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {tuple(x.shape)} {x.dtype}")
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.shape[0] == 0:
        return out
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    out2 = out.view(-1, n)
    _rms_norm_kernel[(x2.shape[0],)](
        x2, out2, out2, weight, x2.stride(0), out2.stride(0), 0, float(eps),
        N=n, BLOCK=triton.next_power_of_2(n), ADD_RESIDUAL=False, num_warps=_num_warps(n),
    )  # fmt: skip
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: residual += x (rounded to residual's dtype), then x = rms_norm(residual, weight).

    Both must be contiguous and of one shape; returns (x, residual), the same tensors.
    """
    check_norm_weight(x, weight)
    if residual.shape != x.shape or not x.is_contiguous() or not residual.is_contiguous():
        raise ValueError(
            f"x {tuple(x.shape)} and residual {tuple(residual.shape)} must be contiguous and alike"
        )
    n = x.shape[-1]
    x2, res2 = x.view(-1, n), residual.view(-1, n)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, x2, res2, weight, x2.stride(0), x2.stride(0), res2.stride(0), float(eps),
            N=n, BLOCK=triton.next_power_of_2(n), ADD_RESIDUAL=True, num_warps=_num_warps(n),
        )  # fmt: skip
    return x, residual
