"""What one model forward needs: the tokens of a batch and where their K/V live in the pool."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill: each request adds extend_len tokens after prefix_len cached ones
    DECODE = "decode"  # one new token per request


@dataclass
class ForwardBatch:
    """A batch of requests for one forward pass.

    Token-dimension tensors are ragged-flattened in request order:
    request i owns tokens [extend_start[i], extend_start[i] + extend_lens[i]).

        req_to_token[req_pool_indices[i], :seq_lens[i]]   KV slots of request i after this step
                     prefix part  = [:prefix_lens[i]]      already in the pool
                     extend part  = [prefix_lens[i]:]      == out_cache_loc of its new tokens
    """

    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64: pool slots the new K/V are written to
    req_to_token: torch.Tensor  # [max_reqs, max_context] int32 (the pool's table)
    req_pool_indices: torch.Tensor  # [B] int64: rows of req_to_token in use
    seq_lens: torch.Tensor  # [B] int64: prefix + extend
    prefix_lens: torch.Tensor  # [B] int64
    extend_lens: torch.Tensor  # [B] int64 (all ones for DECODE)
    seq_lens_cpu: list[int]
    prefix_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    logits_indices: torch.Tensor  # [L] int64: token rows whose logits the caller wants

    @classmethod
    def build(
        cls,
        input_ids: list[int],
        positions: torch.Tensor,
        out_cache_loc: torch.Tensor,
        req_to_token: torch.Tensor,
        rows: list[int],
        prefix_lens: list[int],
        extend_lens: list[int],
        logits_indices: torch.Tensor,
        device: torch.device,
    ) -> ForwardBatch:
        """The batch of requests at `rows` of req_to_token, each adding extend_lens[i] tokens
        after prefix_lens[i] cached ones (DECODE when every request adds one)."""
        seq = [p + n for p, n in zip(prefix_lens, extend_lens, strict=True)]

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        return cls(
            mode=ForwardMode.DECODE if all(n == 1 for n in extend_lens) else ForwardMode.EXTEND,
            input_ids=ints(input_ids),
            positions=positions.to(device),
            out_cache_loc=out_cache_loc.to(device),
            req_to_token=req_to_token,
            req_pool_indices=ints(rows),
            seq_lens=ints(seq),
            prefix_lens=ints(prefix_lens),
            extend_lens=ints(extend_lens),
            seq_lens_cpu=seq,
            prefix_lens_cpu=list(prefix_lens),
            extend_lens_cpu=list(extend_lens),
            logits_indices=logits_indices.to(device),
        )

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def extend_start(self) -> torch.Tensor:
        return torch.cumsum(self.extend_lens, 0) - self.extend_lens
