"""The model's projections: the compiled small-row CPU kernel for a few rows, F.linear otherwise.

A step with at most `MAX_ROWS` tokens (decode of a few requests, speculative verification) is
bound by reading the weights; on the CPU the small-row kernel (kernels/cpu_linear.py) streams
them much faster than `F.linear`. Prefill, large batches, other dtypes and autograd go to
`F.linear` (kernels/reference.py `linear_ref`); on CUDA everything does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from radixflow.kernels.cpu_linear import DTYPES, MAX_ROWS, small_linear
from radixflow.kernels.reference import linear_ref
from radixflow.runtime.layers.target import OpsTarget

LinearFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


@dataclass(frozen=True)
class LinearImpl:
    name: str
    fn: LinearFn


def _small_rows_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the small-row kernel for the shapes it takes."""
    if (
        x.dim() == 2
        and 1 <= x.shape[0] <= MAX_ROWS
        and x.dtype in DTYPES
        and weight.dtype == x.dtype
        and weight.is_contiguous()
        and (bias is None or bias.dtype == x.dtype)
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        return small_linear(x, weight, bias)
    return linear_ref(x, weight, bias)


def choose_linear(target: OpsTarget) -> LinearImpl:
    if target.cpu_kernels:
        return LinearImpl("cpu-small-rows", _small_rows_linear)
    return LinearImpl("torch", linear_ref)


class Linear(nn.Linear):
    """`nn.Linear` (same parameters and state-dict names) whose forward runs the bound impl."""

    def __init__(self, in_features: int, out_features: int, bias: bool, impl: LinearImpl) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl.fn(x, self.weight, self.bias)
