"""Rotary position embedding applied in place to q and k, neox (rotate-half) or GPT-J (interleaved).

cos_sin_cache [max_position, rotary_dim] holds cos in the first rotary_dim/2 columns and sin in
the rest (any scaling, e.g. llama3, is already folded in by whoever built it). Only the first
rotary_dim dims of each head rotate; pair i is

    neox    (x[i], x[i + rotary_dim/2])
    GPT-J   (x[2i], x[2i + 1])

and becomes (a cos - b sin, b cos + a sin), computed in fp32 and rounded once. Reference:
kernels/reference.py `rotary_embedding_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.reference import check_rotary, heads_view


@triton.jit
def _rotate_heads(
    x_ptr, stride_h, num_heads, idx_a, idx_b, cos, sin, mask_r, BLOCK_H: tl.constexpr
):
    offs_h = tl.arange(0, BLOCK_H)
    mask = (offs_h < num_heads)[:, None] & mask_r[None, :]
    ptr_a = x_ptr + offs_h[:, None] * stride_h + idx_a[None, :]
    ptr_b = x_ptr + offs_h[:, None] * stride_h + idx_b[None, :]
    a = tl.load(ptr_a, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(ptr_b, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr_a, (a * cos[None, :] - b * sin[None, :]).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(ptr_b, (b * cos[None, :] + a * sin[None, :]).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr,
    q_ptr,
    k_ptr,
    cache_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cache,
    num_q_heads,
    num_k_heads,
    HALF: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    IS_NEOX: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < HALF
    cos = tl.load(cache_ptr + pos * stride_cache + offs_r, mask=mask_r, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + offs_r, mask=mask_r, other=0.0)
    sin = sin.to(tl.float32)
    if IS_NEOX:
        idx_a = offs_r
        idx_b = offs_r + HALF
    else:
        idx_a = 2 * offs_r
        idx_b = 2 * offs_r + 1
    _rotate_heads(q_ptr + t * stride_qt, stride_qh, num_q_heads, idx_a, idx_b, cos, sin, mask_r,
                  BLOCK_HQ)  # fmt: skip
    _rotate_heads(k_ptr + t * stride_kt, stride_kh, num_k_heads, idx_a, idx_b, cos, sin, mask_r,
                  BLOCK_HK)  # fmt: skip


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_dim: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq*D] (or [T, Hq, D]) and k [T, Hk*D] in place at positions [T].

    Returns (q, k), the same tensors.
    """
    rotary_dim = check_rotary(positions, cos_sin_cache, head_dim)
    num_tokens = positions.shape[0]
    qv = heads_view(q, num_tokens, head_dim, "q")
    kv = heads_view(k, num_tokens, head_dim, "k")
    if num_tokens == 0:
        return q, k
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    half = rotary_dim // 2
    _rotary_kernel[(num_tokens,)](
        positions, qv, kv, cache,
        qv.stride(0), qv.stride(1), kv.stride(0), kv.stride(1), cache.stride(0),
        qv.shape[1], kv.shape[1],
        HALF=half, BLOCK_R=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(qv.shape[1]), BLOCK_HK=triton.next_power_of_2(kv.shape[1]),
        IS_NEOX=is_neox, num_warps=4,
    )  # fmt: skip
    return q, k
