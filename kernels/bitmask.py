"""Token bitmasks in xgrammar's layout, and masking logits with them.

    bitmask [B, ceil(V / 32)] int32      bit i of word j allows token 32 * j + i

A 0 bit sets that token's logit to -inf; a 1 bit leaves it. Logit columns beyond 32 * words and
bits beyond the logits' width are ignored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_WORDS = 128  # 4096 tokens per program


def bitmask_words(vocab_size: int) -> int:
    """int32 words per bitmask row."""
    return (vocab_size + 31) // 32


def allocate_token_bitmask(
    batch_size: int, vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A [batch_size, ceil(vocab_size/32)] int32 bitmask with every token allowed."""
    return torch.full((batch_size, bitmask_words(vocab_size)), -1, dtype=torch.int32, device=device)


def reset_token_bitmask(bitmask: torch.Tensor) -> torch.Tensor:
    """Allow every token again (in place)."""
    return bitmask.fill_(-1)


def unpack_token_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[..., words] int32 -> [..., vocab_size] bool, True where the token is allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(-2)[..., :vocab_size].bool()


def _byte_bias(device: torch.device) -> torch.Tensor:
    """[256, 8] float32: for each byte value, +inf where bit i is set and -inf where it is clear."""
    bits = (torch.arange(256, device=device).unsqueeze(-1) >> torch.arange(8, device=device)) & 1
    return torch.where(bits.bool(), float("inf"), float("-inf"))


_BYTE_BIAS: dict[torch.device, torch.Tensor] = {}


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


def _check(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None) -> int:
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.shape[0] != logits.shape[0]:
        raise ValueError(
            f"expected logits [B, V] and bitmask [B, words], got {tuple(logits.shape)} and "
            f"{tuple(bitmask.shape)}"
        )
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    if indices is not None and indices.dim() != 1:
        raise ValueError(f"indices must be 1-D, got {tuple(indices.shape)}")
    return min(logits.shape[1], 32 * bitmask.shape[1])


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """Set logits[r, t] = -inf where bitmask[r] forbids t, for rows r in indices (default all)."""
    vocab = _check(logits, bitmask, indices)
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


def apply_token_bitmask_ref(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """Torch twin of apply_token_bitmask, and the CPU path.

    Each bitmask byte looks up 8 bias values (+inf for an allowed token, -inf for a forbidden
    one) and `minimum(logit, bias)` masks the whole batch in one elementwise op (a NaN logit
    stays NaN, where the kernel writes -inf over a forbidden one).
    """
    vocab = _check(logits, bitmask, indices)
    if vocab == 0 or (indices is not None and indices.shape[0] == 0):
        return
    table = _BYTE_BIAS.get(logits.device)
    if table is None:
        table = _BYTE_BIAS.setdefault(logits.device, _byte_bias(logits.device))
    words = bitmask if indices is None else bitmask[indices.long()]
    # byte k of word j holds tokens 32j+8k .. 32j+8k+7
    shifts = torch.arange(0, 32, 8, dtype=torch.int32, device=words.device)
    data = ((words.unsqueeze(-1) >> shifts) & 0xFF).flatten(-2).long()
    bias = torch.nn.functional.embedding(data, table).flatten(-2)[:, :vocab].to(logits.dtype)
    if indices is None:
        view = logits[:, :vocab]
        torch.minimum(view, bias, out=view)
    else:
        rows = indices.long()
        logits[rows, :vocab] = torch.minimum(logits[rows, :vocab], bias)
