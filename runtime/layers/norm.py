"""RMSNorm, with the residual add before it fused in where the implementation can.

torch    F.rms_norm (fp32 statistics for low-precision inputs, as HF does)
cpu      kernels/cpu_elementwise.py, one pass over [T, D] rows (other shapes: torch)
triton   kernels/norm.py
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixflow.kernels import cpu_elementwise
from radixflow.runtime.layers.target import OpsTarget

Norm = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
AddNorm = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]
]


@dataclass(frozen=True)
class RMSNormImpl:
    """norm(x, w, eps); add_norm(x, residual, w, eps) -> (norm(x + residual), x + residual)."""

    name: str
    norm: Norm
    add_norm: AddNorm


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _unfused(norm: Norm) -> AddNorm:
    def add_norm(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = x + residual
        return norm(residual, weight, eps), residual

    return add_norm


def _cpu_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dim() == 2 and x.stride(-1) == 1:
        return cpu_elementwise.rms_norm(x, weight, eps)
    return torch_rms_norm(x, weight, eps)


def _cpu_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum is written over `residual` (the kernel's one pass)."""
    if x.dim() == 2 and x.stride(-1) == 1 and residual.stride(-1) == 1:
        return cpu_elementwise.add_rms_norm(x, residual, weight, eps)
    return _unfused(torch_rms_norm)(x, residual, weight, eps)


def choose_rms_norm(target: OpsTarget) -> RMSNormImpl:
    if target.triton:
        from radixflow.kernels.norm import rms_norm

        return RMSNormImpl("triton", rms_norm, _unfused(rms_norm))
    if target.cpu_kernels:
        return RMSNormImpl("cpu", _cpu_rms_norm, _cpu_add_rms_norm)
    return RMSNormImpl("torch", torch_rms_norm, _unfused(torch_rms_norm))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, impl: RMSNormImpl) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl.norm(x, self.weight, self.eps)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual)."""
        return self.impl.add_norm(x, residual, self.weight, self.eps)
