"""Write new tokens' K/V into the paged pool: k_buffer[loc[t]] = k[t], v_buffer[loc[t]] = v[t]."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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


def _rows(x: torch.Tensor, num_tokens: int, row: int, name: str) -> torch.Tensor:
    if x.dim() < 1 or x.shape[0] != num_tokens or x.numel() != num_tokens * row:
        raise ValueError(f"{name} must hold [{num_tokens}, {row}] values, got {tuple(x.shape)}")
    flat = x.reshape(num_tokens, row)
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def _check(k_buffer: torch.Tensor, v_buffer: torch.Tensor, loc: torch.Tensor) -> tuple[int, int]:
    if k_buffer.dim() != 3 or v_buffer.shape != k_buffer.shape:
        raise ValueError(
            f"k/v buffers must be [S, KVH, D] of one shape, got {tuple(k_buffer.shape)}, "
            f"{tuple(v_buffer.shape)}"
        )
    if not k_buffer.is_contiguous() or not v_buffer.is_contiguous():
        raise ValueError("k/v buffers must be contiguous")
    if loc.dim() != 1:
        raise ValueError(f"loc must be 1-D, got {tuple(loc.shape)}")
    return loc.shape[0], k_buffer.shape[1] * k_buffer.shape[2]


def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Store k, v ([T, KVH, D] or [T, KVH*D]) at slots loc [T] of the [S, KVH, D] buffers."""
    num_tokens, row = _check(k_buffer, v_buffer, loc)
    k2, v2 = _rows(k, num_tokens, row, "k"), _rows(v, num_tokens, row, "v")
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k_buffer, v_buffer, loc, k2, v2, k2.stride(0), v2.stride(0), row,
        ROW=row, BLOCK=triton.next_power_of_2(row), num_warps=4,
    )  # fmt: skip


def store_kv_ref(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Torch twin of store_kv."""
    num_tokens, row = _check(k_buffer, v_buffer, loc)
    shape = (num_tokens, *k_buffer.shape[1:])
    k_buffer[loc] = _rows(k, num_tokens, row, "k").reshape(shape).to(k_buffer.dtype)
    v_buffer[loc] = _rows(v, num_tokens, row, "v").reshape(shape).to(v_buffer.dtype)
