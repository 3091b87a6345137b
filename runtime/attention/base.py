"""The seam between the model and its attention implementation.

A backend reads everything it needs from the ForwardBatch and the KV pool; the model
never sees page tables. `forward` first writes the new K/V at `out_cache_loc`, then
attends over the request's whole sequence (cached prefix + new tokens, causal).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from radixflow.runtime.forward_batch import ForwardBatch


@dataclass(frozen=True)
class AttentionLayerSpec:
    layer_id: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float
    logit_cap: float = 0.0  # 0 disables soft-capping
    sliding_window: int = -1  # -1 disables the window


class AttentionBackend(ABC):
    """Computes attention for one layer of a ForwardBatch over the paged KV pool."""

    @abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Precompute per-batch data shared by all layers (called once per forward)."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads * head_dim]
        k: torch.Tensor,  # [T, num_kv_heads * head_dim]
        v: torch.Tensor,  # [T, num_kv_heads * head_dim]
        layer: AttentionLayerSpec,
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [T, num_heads * head_dim]
        ...
