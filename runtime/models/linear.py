"""The one place the model's projections choose between the compiled CPU kernel and F.linear.

A step with at most `MAX_ROWS` tokens (decode of a few requests, speculative verification) is
bound by reading the weights; on the CPU the small-row kernel streams them much faster than
`F.linear`. Everything else (prefill, large batches, CUDA, autograd) goes to `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixflow.kernels.cpu_linear import DTYPES, MAX_ROWS, small_linear, small_linear_available


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the CPU small-row kernel where it applies."""
    if (
        x.dim() == 2
        and 1 <= x.shape[0] <= MAX_ROWS
        and x.device.type == "cpu"
        and x.dtype in DTYPES
        and weight.dtype == x.dtype
        and weight.is_contiguous()
        and (bias is None or bias.dtype == x.dtype)
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and small_linear_available()
    ):
        return small_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """`nn.Linear` whose forward goes through `linear` (same parameters and state-dict names)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
