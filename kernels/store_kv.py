"""Write new tokens' K/V into the paged pool in Triton: k_buffer[loc[t]] = k[t], v_buffer[loc[t]] = v[t].

Reference: kernels/reference.py `store_kv_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixflow.kernels.reference import check_store_kv, kv_rows


@triton.jit
def _store_kv_kernel(
    k_buf_ptr,
    v_buf_ptr,
    loc_ptr,
    k_ptr,
    v_ptr,
    stride_kt,
    stride_vt,
    stride_buf,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + t).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < ROW
    k = tl.load(k_ptr + t * stride_kt + offs, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + offs, mask=mask)
    tl.store(k_buf_ptr + slot * stride_buf + offs, k, mask=mask)
    tl.store(v_buf_ptr + slot * stride_buf + offs, v, mask=mask)


def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Store k, v ([T, KVH, D] or [T, KVH*D]) at slots loc [T] of the [S, KVH, D] buffers."""
    num_tokens, row = check_store_kv(k_buffer, v_buffer, loc)
    k2, v2 = kv_rows(k, num_tokens, row, "k"), kv_rows(v, num_tokens, row, "v")
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k_buffer, v_buffer, loc, k2, v2, k2.stride(0), v2.stride(0), row,
        ROW=row, BLOCK=triton.next_power_of_2(row), num_warps=4,
    )  # fmt: skip
