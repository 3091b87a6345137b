"""Extend (prefill) attention: new tokens over their cached paged prefix plus causal self-attention.

Tokens are ragged-flattened: request i owns rows [extend_start[i], extend_start[i] + extend_lens[i])
of q/k/v. Its new token j sits at position prefix_lens[i] + j and sees

    prefix keys    slots req_to_token[req_pool_indices[i], :prefix_lens[i]]   (read from the pool)
    new keys       rows extend_start[i] + [0, j]                              (read from k/v)

restricted, when sliding_window > 0, to keys at positions > position - sliding_window (the last
`sliding_window` tokens, itself included). One online softmax runs across both parts.

    grid (B, H, blocks of BLOCK_M new tokens)

Reference: kernels/reference.py `extend_attention_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.attention_block import attend_block, load_paged_kv
from radixflow.kernels.reference import check_extend_args

BLOCK_M = 128  # on an H200 (head dim 128, bf16) 1.5-1.7x faster than 64 query rows
BLOCK_N = 64


@triton.jit
def _extend_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    k_buf_ptr,
    v_buf_ptr,
    req_to_token_ptr,
    req_pool_ptr,
    prefix_lens_ptr,
    extend_lens_ptr,
    extend_start_ptr,
    sm_scale,
    logit_cap,
    sliding_window,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_kbs,
    stride_kbh,
    stride_vbs,
    stride_vbh,
    stride_r2t,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_CAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    m_block = tl.program_id(2)
    extend_len = tl.load(extend_lens_ptr + b)
    if m_block * BLOCK_M >= extend_len:
        return
    prefix_len = tl.load(prefix_lens_ptr + b)
    tok0 = tl.load(extend_start_ptr + b)
    row = tl.load(req_pool_ptr + b)
    kv_head = h // GROUP

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < extend_len
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q = tl.load(
        q_ptr + (tok0 + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )
    q_pos = prefix_len + offs_m
    # First key position any query of this block can see.
    lo = prefix_len * 0
    if HAS_WINDOW:
        lo = tl.maximum(prefix_len + m_block * BLOCK_M - sliding_window + 1, 0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    for start in range(lo, prefix_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < prefix_len
        k, v = load_paged_kv(
            k_buf_ptr, v_buf_ptr, req_to_token_ptr, row, stride_r2t, offs_n, mask_n,
            kv_head, stride_kbs, stride_kbh, stride_vbs, stride_vbh, offs_d, mask_d,
        )  # fmt: skip
        visible = mask_n[None, :] & mask_m[:, None]
        if HAS_WINDOW:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - sliding_window)
        m_i, l_i, acc = attend_block(q, k, v, visible, m_i, l_i, acc, sm_scale, logit_cap, HAS_CAP)

    hi = tl.minimum(extend_len, (m_block + 1) * BLOCK_M)
    for start in range(tl.maximum(lo - prefix_len, 0), hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(
            k_ptr + (tok0 + offs_n)[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            v_ptr + (tok0 + offs_n)[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        visible = mask_n[None, :] & (offs_n[None, :] <= offs_m[:, None])
        if HAS_WINDOW:
            visible = visible & (offs_n[None, :] > offs_m[:, None] - sliding_window)
        m_i, l_i, acc = attend_block(q, k, v, visible, m_i, l_i, acc, sm_scale, logit_cap, HAS_CAP)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    tl.store(
        o_ptr + (tok0 + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
        acc / l_safe[:, None],
        mask=mask_m[:, None] & mask_d[None, :],
    )


def extend_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    sliding_window: int = -1,
    max_extend_len: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of the new tokens q [T, H, D] over prefix + causal new keys; returns o [T, H, D].

    k, v [T, KVH, D] are the new tokens' keys/values (already stored in the pool too).
    max_extend_len sizes the grid; None reads extend_lens.max() (a device sync).
    """
    check_extend_args(
        q, k, v, k_buffer, v_buffer, req_to_token, req_pool_indices,
        prefix_lens, extend_lens, extend_start, logit_cap, sliding_window, out,
    )  # fmt: skip
    num_tokens, num_heads, head_dim = q.shape
    if out is None:
        out = torch.empty_like(q)
    batch = req_pool_indices.shape[0]
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max()) if batch else 0
    if num_tokens == 0 or max_extend_len == 0:
        return out
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if k_buffer.stride(-1) != 1 or v_buffer.stride(-1) != 1 or req_to_token.stride(-1) != 1:
        raise ValueError("k_buffer, v_buffer and req_to_token must be contiguous in the last dim")

    grid = (batch, num_heads, triton.cdiv(max_extend_len, BLOCK_M))
    _extend_kernel[grid](
        q, k, v, out, k_buffer, v_buffer, req_to_token, req_pool_indices,
        prefix_lens, extend_lens, extend_start,
        float(sm_scale), float(logit_cap), int(sliding_window),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), req_to_token.stride(0),
        GROUP=num_heads // k.shape[1], HEAD_DIM=head_dim, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        HAS_CAP=logit_cap > 0, HAS_WINDOW=sliding_window > 0,
        num_warps=4 if head_dim <= 64 else 8, num_stages=2,
    )  # fmt: skip
    return out
