"""How a Llama-family model splits over tensor-parallel ranks (Megatron style), per rank.

    column-parallel  q/k/v, gate/up: output rows split (bias with them); no collective
    row-parallel     o, down: input columns split; one all-reduce after the matmul
    vocab-parallel   embedding and lm_head: vocabulary rows split (padded to a multiple of
                     the ranks); lookups mask the ids outside the rank's range and all-reduce,
                     logits are all-gathered and the padded tail cut off
    replicated       norms (Qwen3's q/k norms are per head_dim)

KV heads split like q heads when they divide by the ranks; with fewer KV heads than ranks
(ranks a multiple of them) each rank holds the one KV head its q heads read, as SGLang and
vLLM do. `ModelShards.weight_slice` is the loader's plan: which slice of a checkpoint weight
this rank reads (runtime/model_loader.py reads only that slice).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from radixflow.kernels.quant_formats import quant_format
from radixflow.runtime.distributed.group import TPGroup

logger = logging.getLogger(__name__)

_PROJECTION = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.(weight|bias)$")
VOCAB_MATRICES = ("model.embed_tokens.weight", "lm_head.weight")


class WeightSlice(NamedTuple):
    """Rows (`dim` 0) or columns (`dim` 1) [start, end) of a checkpoint weight."""

    dim: int
    start: int
    end: int


@dataclass(frozen=True)
class ModelShards:
    """This rank's [start, end) of every split dimension of the model."""

    tp: TPGroup
    head_dim: int
    heads: tuple[int, int]  # query heads
    kv_heads: tuple[int, int]
    intermediate: tuple[int, int]
    vocab: tuple[int, int]  # the real vocabulary rows this rank holds (the last may be short)
    vocab_rows: int  # rows each rank's embedding / lm_head has: ceil(vocab / ranks)

    @classmethod
    def of(cls, config: Any, tp: TPGroup) -> ModelShards:
        """The split of the HF `config`'s model for `tp`'s rank; a ValueError naming the
        dimension that does not split."""
        n, rank = tp.size, tp.rank
        heads = config.num_attention_heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        if heads % n:
            raise ValueError(
                f"num_attention_heads {heads} does not split over tp_size {n}: "
                "choose a tp_size that divides it"
            )
        if kv % n == 0:
            kv_range = tp.shard(kv)
        elif n % kv == 0:  # fewer KV heads than ranks: each rank keeps its q heads' one
            kv_head = rank // (n // kv)
            kv_range = (kv_head, kv_head + 1)
        else:
            raise ValueError(f"num_key_value_heads {kv} and tp_size {n}: one must divide the other")
        if config.intermediate_size % n:
            raise ValueError(
                f"intermediate_size {config.intermediate_size} does not split over tp_size {n}"
            )
        vocab = config.vocab_size
        rows = math.ceil(vocab / n)
        return cls(
            tp=tp,
            head_dim=head_dim,
            heads=tp.shard(heads),
            kv_heads=kv_range,
            intermediate=tp.shard(config.intermediate_size),
            vocab=(min(rank * rows, vocab), min((rank + 1) * rows, vocab)),
            vocab_rows=rows,
        )

    @property
    def num_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def intermediate_size(self) -> int:
        return self.intermediate[1] - self.intermediate[0]

    def weight_slice(self, name: str) -> WeightSlice | None:
        """The part of checkpoint weight `name` this rank reads; None: all of it (replicated,
        or one rank)."""
        if self.tp.size == 1:
            return None
        if name in VOCAB_MATRICES:
            return WeightSlice(0, *self.vocab)
        match = _PROJECTION.search(name)
        if match is None:
            return None
        part = match.group(1)
        hd = self.head_dim
        if part == "q":
            return WeightSlice(0, self.heads[0] * hd, self.heads[1] * hd)
        if part in ("k", "v"):
            return WeightSlice(0, self.kv_heads[0] * hd, self.kv_heads[1] * hd)
        if part in ("gate", "up"):
            return WeightSlice(0, *self.intermediate)
        if part == "o":
            return WeightSlice(1, self.heads[0] * hd, self.heads[1] * hd)
        return WeightSlice(1, *self.intermediate)  # down

    def quant_plan(self, plan: dict[str, str]) -> dict[str, str]:
        """`plan` (HF name -> qtype kept packed) less the row-parallel weights whose column
        slice does not fall on the qtype's block boundaries: those are dequantized at load."""
        if self.tp.size == 1:
            return plan
        kept = {}
        for name, qtype in plan.items():
            cut = self.weight_slice(name)
            block = quant_format(qtype).block_size
            if cut is not None and cut.dim == 1 and (cut.start % block or cut.end % block):
                logger.info(
                    "%s: its columns %d-%d on tensor-parallel rank %d are not whole %s blocks "
                    "of %d: dequantized at load",
                    name, cut.start, cut.end, self.tp.rank, qtype, block,
                )  # fmt: skip
                continue
            kept[name] = qtype
        return kept
