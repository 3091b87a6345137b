"""Paged decode attention: one query token per request over its K/V gathered through req_to_token.

Split-KV in two stages:

    stage 1  grid (B, head blocks, splits)   each program: the query heads of one KV head (GQA)
             over one slice of the sequence -> mid_o [B, H, S, D] (normalised), mid_lse [B, H, S]
    stage 2  grid (B, H)                     combine the S slices by their log-sum-exp

A request's visible keys are [kv_start, seq_len) with kv_start = max(0, seq_len - sliding_window)
when a window is set (the query, at position seq_len - 1, sees the last `sliding_window` tokens,
itself included: HF's convention) and 0 otherwise. That range is cut into `num_kv_splits` slices
of equal length rounded up to the key block; trailing slices of short requests stay empty.
A request with seq_len 0 (batch padding) gets a zero output. Reference: kernels/reference.py
`decode_attention_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.attention_block import attend_block, load_paged_kv
from radixflow.kernels.reference import check_decode_args

BLOCK_N = 64
MAX_KV_SPLITS = 16


@triton.jit
def _decode_stage1(
    q_ptr,
    k_buf_ptr,
    v_buf_ptr,
    req_to_token_ptr,
    req_pool_ptr,
    seq_lens_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    sm_scale,
    logit_cap,
    sliding_window,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_r2t,
    stride_mob,
    stride_moh,
    stride_mos,
    stride_mlb,
    stride_mlh,
    GROUP: tl.constexpr,
    HEAD_BLOCKS_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_CAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
):
    b = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    kv_head = head_block // HEAD_BLOCKS_PER_KV
    offs_g = (head_block % HEAD_BLOCKS_PER_KV) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    seq_len = tl.load(seq_lens_ptr + b)
    row = tl.load(req_pool_ptr + b)
    kv_start = seq_len * 0
    if HAS_WINDOW:
        kv_start = tl.maximum(seq_len - sliding_window, 0)
    split_len = tl.cdiv(tl.cdiv(seq_len - kv_start, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = kv_start + split * split_len
    hi = tl.minimum(lo + split_len, seq_len)

    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        k, v = load_paged_kv(
            k_buf_ptr, v_buf_ptr, req_to_token_ptr, row, stride_r2t, offs_n, mask_n,
            kv_head, stride_ks, stride_kh, stride_vs, stride_vh, offs_d, mask_d,
        )  # fmt: skip
        m_i, l_i, acc = attend_block(
            q, k, v, mask_n[None, :], m_i, l_i, acc, sm_scale, logit_cap, HAS_CAP
        )

    nonempty = l_i > 0
    l_safe = tl.where(nonempty, l_i, 1.0)
    lse = tl.where(nonempty, m_i + tl.log(l_safe), float("-inf"))
    mid_o = mid_o_ptr + b * stride_mob + heads[:, None] * stride_moh + split * stride_mos
    tl.store(mid_o + offs_d[None, :], acc / l_safe[:, None], mask=mask_h[:, None] & mask_d[None, :])
    tl.store(mid_lse_ptr + b * stride_mlb + heads * stride_mlh + split, lse, mask=mask_h)


@triton.jit
def _decode_stage2(
    mid_o_ptr,
    mid_lse_ptr,
    o_ptr,
    stride_mob,
    stride_moh,
    stride_mos,
    stride_mlb,
    stride_mlh,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(
        mid_lse_ptr + b * stride_mlb + h * stride_mlh + offs_s, mask=mask_s, other=float("-inf")
    )
    m = tl.max(lse, 0)
    w = tl.exp(lse - tl.where(m == float("-inf"), 0.0, m))  # all slices empty: w = 0, o = 0
    parts = tl.load(
        mid_o_ptr
        + b * stride_mob
        + h * stride_moh
        + offs_s[:, None] * stride_mos
        + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )
    total = tl.sum(w, 0)
    out = tl.sum(w[:, None] * parts, 0) / tl.where(total > 0, total, 1.0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out, mask=mask_d)


def choose_num_kv_splits(num_programs: int, max_seq_len: int) -> int:
    """Enough slices to fill the machine (about 1024 programs) with at least 256 keys each."""
    by_len = triton.cdiv(max(max_seq_len, 1), 256)
    by_occupancy = triton.cdiv(1024, max(num_programs, 1))
    return max(1, min(MAX_KV_SPLITS, by_len, by_occupancy))


def head_block_size(group: int) -> int:
    """Query heads per program: tl.dot needs at least 16 rows; more than 64 go to several."""
    return max(16, min(64, triton.next_power_of_2(group)))


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    sliding_window: int = -1,
    num_kv_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of q [B, H, D] over each request's paged K/V; returns o [B, H, D] (written to out).

    Request i reads slots req_to_token[req_pool_indices[i], :seq_lens[i]] of k_buffer/v_buffer
    [S, KVH, D]; query head h uses KV head h // (H // KVH). Scores are q.k * sm_scale, soft-capped
    to logit_cap * tanh(score / logit_cap) when logit_cap > 0. num_kv_splits None picks
    choose_num_kv_splits (reads seq_lens.max(), a device sync); pass a fixed value under CUDA
    graphs.
    """
    check_decode_args(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens,
        logit_cap, sliding_window, num_kv_splits, out,
    )  # fmt: skip
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    if k_buffer.stride(-1) != 1 or v_buffer.stride(-1) != 1 or req_to_token.stride(-1) != 1:
        raise ValueError("k_buffer, v_buffer and req_to_token must be contiguous in the last dim")

    block_h = head_block_size(group)
    head_blocks_per_kv = triton.cdiv(group, block_h)
    if num_kv_splits is None:
        max_len = int(seq_lens.max())
        num_kv_splits = choose_num_kv_splits(batch * num_kv_heads * head_blocks_per_kv, max_len)
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs K >= 16
    mid_o = torch.empty(
        (batch, num_heads, num_kv_splits, head_dim), dtype=torch.float32, device=q.device
    )
    mid_lse = torch.empty((batch, num_heads, num_kv_splits), dtype=torch.float32, device=q.device)

    _decode_stage1[(batch, num_kv_heads * head_blocks_per_kv, num_kv_splits)](
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, mid_o, mid_lse,
        float(sm_scale), float(logit_cap), int(sliding_window),
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        GROUP=group, HEAD_BLOCKS_PER_KV=head_blocks_per_kv, HEAD_DIM=head_dim,
        NUM_SPLITS=num_kv_splits, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_N=BLOCK_N,
        HAS_CAP=logit_cap > 0, HAS_WINDOW=sliding_window > 0,
        num_warps=4, num_stages=2,
    )  # fmt: skip
    _decode_stage2[(batch, num_heads)](
        mid_o, mid_lse, out,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, NUM_SPLITS=num_kv_splits,
        BLOCK_S=triton.next_power_of_2(num_kv_splits), BLOCK_D=block_d,
        num_warps=4,
    )  # fmt: skip
    return out
