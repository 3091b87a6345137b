"""The token embedding with packed rows: a lookup gathers the requested rows' blocks and
dequantizes only those (kernels/quant_formats.py); tied to lm_head, the same packed matrix
multiplies the final hidden states through the bound quantized linear."""

from __future__ import annotations

import torch

from radixflow.kernels.quant_formats import dequantize
from radixflow.runtime.layers.linear import QuantLinear, QuantLinearImpl


class QuantEmbedding(QuantLinear):
    """`embedding(ids)` -> [T, dim] rows in `dtype`; `linear(x)` -> logits over the vocabulary."""

    def __init__(
        self, num_embeddings: int, dim: int, qtype: str, dtype: torch.dtype, impl: QuantLinearImpl
    ) -> None:
        super().__init__(dim, [(num_embeddings, qtype)], False, impl)
        self.qtype = qtype
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.packed(0).index_select(0, ids.reshape(-1))
        return dequantize(rows, self.qtype, self.in_features).to(self.dtype)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)
