"""Triton building blocks shared by the attention kernels: soft-capping and one online-softmax step.

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
def attend_block(q, k, v, visible, m_i, l_i, acc, sm_scale, logit_cap, HAS_CAP: tl.constexpr):
    """Fold one block of keys into the running softmax of every query row.

    q [M, D], k [N, D], v [N, D], visible [M, N] bool (or broadcastable to it);
    m_i, l_i [M] fp32; acc [M, D] fp32.
    A row with no visible key so far keeps m_i = -inf, l_i = 0, acc = 0 (no NaN).
    """
    s = tl.dot(q, tl.trans(k)) * sm_scale
    if HAS_CAP:
        s = soft_cap(s, logit_cap)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc
