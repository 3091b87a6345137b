"""Masking logits with a token bitmask in xgrammar's layout, in Triton.

    bitmask [B, ceil(V / 32)] int32      bit i of word j allows token 32 * j + i

A 0 bit sets that token's logit to -inf; a 1 bit leaves it. Logit columns beyond 32 * words and
bits beyond the logits' width are ignored. Reference (and the CPU path): kernels/reference.py
`apply_token_bitmask_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.reference import bitmask_words, check_bitmask

BLOCK_WORDS = 128  # 4096 tokens per program


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    indices_ptr,
    stride_logits,
    stride_bitmask,
    vocab_size,
    num_words,
    HAS_INDICES: tl.constexpr,
    BLOCK_WORDS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    if HAS_INDICES:
        row = tl.load(indices_ptr + row).to(tl.int64)
    offs_w = tl.program_id(1) * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)
    words = tl.load(bitmask_ptr + row * stride_bitmask + offs_w, mask=offs_w < num_words, other=-1)
    bits = tl.arange(0, 32)
    allowed = (words[:, None] >> bits[None, :]) & 1
    tokens = offs_w[:, None] * 32 + bits[None, :]
    blocked = (allowed == 0) & (tokens < vocab_size)
    tl.store(logits_ptr + row * stride_logits + tokens, float("-inf"), mask=blocked)


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """Set logits[r, t] = -inf where bitmask[r] forbids t, for rows r in indices (default all)."""
    vocab = check_bitmask(logits, bitmask, indices)
    rows = logits.shape[0] if indices is None else indices.shape[0]
    if rows == 0 or vocab == 0:
        return
    if logits.stride(-1) != 1 or bitmask.stride(-1) != 1:
        raise ValueError("logits and bitmask must be contiguous in the last dim")
    num_words = bitmask_words(vocab)
    grid = (rows, triton.cdiv(num_words, BLOCK_WORDS))
    _apply_bitmask_kernel[grid](
        logits, bitmask, bitmask if indices is None else indices,
        logits.stride(0), bitmask.stride(0), vocab, num_words,
        HAS_INDICES=indices is not None, BLOCK_WORDS=BLOCK_WORDS, num_warps=4,
    )  # fmt: skip
