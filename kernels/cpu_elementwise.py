"""The decoder layer's row-wise ops compiled for the CPU (kernels/cpu/elementwise.cpp).

RMSNorm (optionally fused with the residual add before it), SiLU-and-mul and NeoX rotary run as
one pass over memory each, with fp32 arithmetic and the rounding order of the model's torch
paths (`F.rms_norm`, `F.silu(g) * u`, runtime/layers/rotary.py `torch_rotary_neox`), so float32
results agree to rounding and bfloat16 ones almost always bit for bit; the references are
kernels/reference.py `rms_norm_ref`, `silu_and_mul_ref`, `rotary_embedding_ref`. Built with the
other CPU kernels by `radixflow.kernels.cpu_build` for the best ISA this CPU runs; `applies`
says when a caller may use them.
"""

from __future__ import annotations

import torch

from radixflow.kernels.cpu_build import cpu_kernels_available

DTYPES = (torch.float32, torch.bfloat16)


def applies(*tensors: torch.Tensor) -> bool:
    """Whether these tensors can go through the kernels: CPU, one of DTYPES, all the same dtype,
    no autograd, and the library built on this machine."""
    # Called per op in every layer: plain attribute checks (`is_cpu`, not `device.type`).
    first = tensors[0]
    if not first.is_cpu or first.dtype not in DTYPES:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t.dtype != first.dtype or not t.is_cpu or (grad and t.requires_grad):
            return False
    return cpu_kernels_available()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`F.rms_norm(x, (D,), weight, eps)` for x [T, D] with a contiguous last dim."""
    _require(x, weight)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    torch.ops.radixflow_cpu.rms_norm(x, None, weight, eps, out)
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); the sum is written into `residual` in place."""
    _require(x, weight, residual)
    if residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} must match x {tuple(x.shape)}")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    torch.ops.radixflow_cpu.rms_norm(x, residual, weight, eps, out)
    return out, residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`F.silu(g) * u` for gate_up = [g | u] of shape [T, 2I]; returns [T, I]."""
    _require(gate_up)
    if gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must have an even last dim, got {tuple(gate_up.shape)}")
    out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype)
    torch.ops.radixflow_cpu.silu_and_mul(gate_up, out)
    return out


def rotary_neox_(x: torch.Tensor, cos_sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] in place (rotate-half layout) by each token's cos | sin row
    of cos_sin [T, rotary_dim] (x's dtype); the dims past rotary_dim are left as they are."""
    if x.dim() != 3 or x.stride(-1) != 1:
        raise ValueError(
            f"x must be [T, heads, head_dim] with a contiguous last dim, got {x.shape}"
        )
    if cos_sin.dtype != x.dtype or cos_sin.shape != (x.shape[0], rotary_dim):
        raise ValueError(
            f"cos_sin must be [{x.shape[0]}, {rotary_dim}] {x.dtype}, got "
            f"{tuple(cos_sin.shape)} {cos_sin.dtype}"
        )
    torch.ops.radixflow_cpu.rotary_neox(x, cos_sin.contiguous(), rotary_dim)
    return x


def _require(x: torch.Tensor, *others: torch.Tensor) -> None:
    if not cpu_kernels_available():
        raise RuntimeError("the CPU elementwise kernels are not available on this machine")
    if not applies(x, *others):
        raise ValueError(
            "the CPU elementwise kernels take CPU float32 or bfloat16 tensors of one dtype, "
            "without autograd"
        )
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"expected [T, D] with a contiguous last dim, got {tuple(x.shape)}")
