"""Paged decode attention compiled for the CPU (kernels/cpu/decode_attention.cpp).

The source is built with the other CPU kernels into one library by `radixflow.kernels.cpu_build`
(for the best ISA this CPU runs, cached on disk per ISA, keyed by the sources, flags and torch
version). When no ISA applies or the build fails, `cpu_decode_attention_available()` is False,
one warning says why, and callers keep their torch path. The torch twin is
`radixflow.kernels.reference.decode_attention_ref`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from radixflow.kernels import cpu_build
from radixflow.kernels.cpu_build import build_root
from radixflow.kernels.reference import check_decode_args

__all__ = [
    "build",
    "build_root",
    "cpu_decode_attention_available",
    "decode_attention_cpu",
    "supports",
]

DTYPES = (torch.float32, torch.bfloat16)
MAX_HEAD_DIM = 256


def build(root: Path | None = None) -> bool:
    """Compile (or reuse) and load the CPU kernel library; False, with a warning, when it cannot."""
    return cpu_build.build(root).isa is not None


def cpu_decode_attention_available() -> bool:
    """True when the compiled kernel is loaded (built on the first call of the process)."""
    return cpu_build.cpu_kernels_available()


def supports(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the loaded kernel handles this pool dtype and head size."""
    return dtype in DTYPES and 0 < head_dim <= MAX_HEAD_DIM and cpu_decode_attention_available()


def decode_attention_cpu(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    sliding_window: int = -1,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of q [B, H, D] over each request's paged K/V; returns o [B, H, D] (into out).

    Request i reads slots req_to_token[req_pool_indices[i], :seq_lens[i]] of k_buffer/v_buffer
    [S, KVH, D] (q, the buffers and out share one dtype, float32 or bfloat16; the math is fp32);
    query head h uses KV head h // (H // KVH). Scores are q.k * sm_scale, soft-capped to
    logit_cap * tanh(score / logit_cap) when logit_cap > 0; with sliding_window > 0 request i
    sees only its last sliding_window keys. When lse [B, H] float32 is given it receives each
    query's log-sum-exp of its (capped) scores, -inf for an empty sequence (whose output is 0).
    req_to_token may be a column slice (req_to_token[:, start:]) to attend a suffix only.
    """
    if not cpu_decode_attention_available():
        raise RuntimeError("the CPU attention kernel is not available on this machine")
    check_decode_args(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, logit_cap,
        sliding_window, None, out,
    )  # fmt: skip
    _check_cpu_args(q, k_buffer, v_buffer, req_to_token, sm_scale)
    if out is None:
        out = torch.empty_like(q)
    if lse is not None and (
        lse.shape != q.shape[:2] or lse.dtype != torch.float32 or lse.stride(-1) != 1
    ):
        raise ValueError(f"lse must be float32 {tuple(q.shape[:2])}, got {tuple(lse.shape)}")
    torch.ops.radixflow_cpu.decode_attention(
        q if q.stride(-1) == 1 else q.contiguous(),
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices.to(torch.int64).contiguous(),
        seq_lens.to(torch.int64).contiguous(),
        float(sm_scale),
        float(logit_cap),
        int(sliding_window),
        out,
        lse,
    )
    return out


def _check_cpu_args(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    sm_scale: float,
) -> None:
    """What this kernel asks beyond any decode-attention call: dtype, device, layout, scale."""
    if q.shape[2] > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be at most {MAX_HEAD_DIM}, got {q.shape[2]}")
    if q.dtype not in DTYPES or k_buffer.dtype != q.dtype or v_buffer.dtype != q.dtype:
        raise ValueError(
            f"q and the k/v buffers must share one dtype of {DTYPES}, got {q.dtype}, "
            f"{k_buffer.dtype}, {v_buffer.dtype}"
        )
    if any(t.device.type != "cpu" for t in (q, k_buffer, v_buffer, req_to_token)):
        raise ValueError("the CPU attention kernel takes CPU tensors only")
    if k_buffer.stride(-1) != 1 or v_buffer.stride(-1) != 1:
        raise ValueError("k_buffer and v_buffer must be contiguous in the last dim")
    if req_to_token.dtype != torch.int32 or req_to_token.stride(1) != 1:
        raise ValueError(
            f"req_to_token must be int32 with contiguous rows, got {req_to_token.dtype}"
        )
    if sm_scale <= 0:
        raise ValueError(f"sm_scale must be positive, got {sm_scale}")
