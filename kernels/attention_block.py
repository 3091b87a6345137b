"""Triton building blocks shared by the attention kernels: paged K/V loads, soft-capping and
one online-softmax step.

The online softmax keeps, per query row, the running max `m`, the running sum of
exp(score - m) `l`, and the unnormalised output `acc`; a block of keys updates all three.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def soft_cap(x, cap):
    """cap * tanh(x / cap), with tanh written through exp (no libdevice)."""
    y = x / cap
    e = tl.exp(-2.0 * tl.abs(y))
    t = (1.0 - e) / (1.0 + e)
    return cap * tl.where(y < 0, -t, t)


@triton.jit
def load_paged_kv(
    k_buf_ptr, v_buf_ptr, req_to_token_ptr, row, stride_r2t, offs_n, mask_n,
    kv_head, stride_ks, stride_kh, stride_vs, stride_vh, offs_d, mask_d,
):  # fmt: skip
    """K and V [N, D] of one KV head for token positions offs_n of the request in `row`,
    read through req_to_token (masked positions read slot 0 and are zeroed)."""
    slots = tl.load(req_to_token_ptr + row * stride_r2t + offs_n, mask=mask_n, other=0)
    slots = slots.to(tl.int64)
    kv_mask = mask_n[:, None] & mask_d[None, :]
    k = tl.load(
        k_buf_ptr + slots[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :],
        mask=kv_mask,
        other=0.0,
    )
    v = tl.load(
        v_buf_ptr + slots[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :],
        mask=kv_mask,
        other=0.0,
    )
    return k, v


@triton.jit
def attend_block(q, k, v, visible, m_i, l_i, acc, sm_scale, logit_cap, HAS_CAP: tl.constexpr):
    """Fold one block of keys into the running softmax of every query row.

    q [M, D], k [N, D], v [N, D], visible [M, N] bool (or broadcastable to it);
    m_i, l_i [M] fp32; acc [M, D] fp32.
    A row with no visible key so far keeps m_i = -inf, l_i = 0, acc = 0 (no NaN).
    """
    # fp32 inputs get fp32 products: tl.dot would round them to TF32 on a GPU
    if q.dtype == tl.float32:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
    else:
        s = tl.dot(q, tl.trans(k)) * sm_scale
    if HAS_CAP:
        s = soft_cap(s, logit_cap)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if v.dtype == tl.float32:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc
