"""Masking logits with the grammars' token bitmasks (constrained decoding, speculative verify).

torch    kernels/reference.py `apply_token_bitmask_ref` (a byte-table lookup, fast on CPU)
triton   kernels/bitmask.py, on CUDA
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixflow.kernels.reference import apply_token_bitmask_ref

# (logits [B, V], bitmask [B, words] int32, rows or None) -> None, logits masked in place
ApplyBitmask = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], None]


@dataclass(frozen=True)
class TokenBitmaskImpl:
    name: str
    apply: ApplyBitmask


def choose_token_bitmask(device: torch.device | str) -> TokenBitmaskImpl:
    """For logits on `device` (the model's)."""
    if torch.device(device).type == "cuda":
        from radixflow.kernels.bitmask import apply_token_bitmask

        return TokenBitmaskImpl("triton", apply_token_bitmask)
    return TokenBitmaskImpl("torch", apply_token_bitmask_ref)
