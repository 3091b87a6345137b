"""SiLU-and-mul of the MLP's fused [gate | up] projection.

torch    kernels/reference.py `silu_and_mul_ref` (F.silu(gate) * up)
cpu      kernels/cpu_elementwise.py, one pass over [T, 2I] rows (other shapes: torch)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixflow.kernels import cpu_elementwise
from radixflow.kernels.reference import silu_and_mul_ref
from radixflow.runtime.layers.target import OpsTarget


@dataclass(frozen=True)
class SiluAndMulImpl:
    name: str
    fn: Callable[[torch.Tensor], torch.Tensor]


def _cpu_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if gate_up.dim() == 2:
        return cpu_elementwise.silu_and_mul(gate_up)
    return silu_and_mul_ref(gate_up)


def choose_silu_and_mul(target: OpsTarget) -> SiluAndMulImpl:
    """No Triton kernel: on CUDA torch's fused elementwise ops are as fast."""
    if target.cpu_kernels:
        return SiluAndMulImpl("cpu", _cpu_silu_and_mul)
    return SiluAndMulImpl("torch", silu_and_mul_ref)
