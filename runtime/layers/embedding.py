"""Token embeddings: packed rows (`QuantEmbedding`) and the vocab-parallel forms a
tensor-parallel rank holds (`VocabParallelEmbedding`, `VocabParallelQuantEmbedding`).

A packed lookup gathers the requested rows' blocks and dequantizes only those
(kernels/quant_formats.py); tied to lm_head, the same packed matrix multiplies the final hidden
states through the bound quantized linear. A vocab-parallel rank holds the rows [start, end) of
the vocabulary: its lookup gives zero rows for the ids outside them and the ranks' rows are
summed (one all-reduce), so every rank ends with every token's embedding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from radixflow.kernels.quant_formats import dequantize, select_rows
from radixflow.runtime.distributed.group import TPGroup
from radixflow.runtime.layers.linear import QuantLinear, QuantLinearImpl


class QuantEmbedding(QuantLinear):
    """`embedding(ids)` -> [T, dim] rows in `dtype`; `linear(x)` -> logits over the vocabulary.
    `qtype` is the file's type; the rows may be stored interleaved (`QuantLinear`)."""

    def __init__(
        self, num_embeddings: int, dim: int, qtype: str, dtype: torch.dtype, impl: QuantLinearImpl
    ) -> None:
        super().__init__(dim, [(num_embeddings, qtype)], False, impl)
        self.qtype = qtype
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = select_rows(self.packed(0), self.segments[0][0], ids.reshape(-1))
        return dequantize(rows, self.qtype, self.in_features).to(self.dtype)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def vocab_parallel_lookup(
    lookup: Callable[[torch.Tensor], torch.Tensor],
    ids: torch.Tensor,
    vocab: tuple[int, int],
    tp: TPGroup,
) -> torch.Tensor:
    """Every id's embedding, from ranks that each `lookup` local rows for ids in `vocab`."""
    local = ids - vocab[0]
    inside = (ids >= vocab[0]) & (ids < vocab[1])
    rows = lookup(torch.where(inside, local, torch.zeros_like(local)))
    return tp.all_reduce(rows.masked_fill_(~inside.unsqueeze(-1), 0))


class VocabParallelEmbedding(nn.Embedding):
    """`nn.Embedding` over this rank's `rows` of the vocabulary; its lookup takes global ids."""

    def __init__(self, rows: int, dim: int, vocab: tuple[int, int], tp: TPGroup) -> None:
        super().__init__(rows, dim)
        self.vocab = vocab
        self.tp = tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_lookup(super().forward, ids, self.vocab, self.tp)


class VocabParallelQuantEmbedding(QuantEmbedding):
    """`QuantEmbedding` over this rank's `rows` of the vocabulary; its lookup takes global ids."""

    def __init__(
        self,
        rows: int,
        dim: int,
        qtype: str,
        dtype: torch.dtype,
        impl: QuantLinearImpl,
        vocab: tuple[int, int],
        tp: TPGroup,
    ) -> None:
        super().__init__(rows, dim, qtype, dtype, impl)
        self.vocab = vocab
        self.tp = tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_lookup(super().forward, ids, self.vocab, self.tp)
