"""A decoder layer's sublayers for a decode step, one compiled CPU op each
(kernels/cpu/decode_layer.cpp): two calls per layer instead of a dozen small ops.

    decode_attention_block   [residual += x]; rms_norm; q|k|v projection (+ bias); [q/k norm];
                             rotary; K/V into the paged pool; decode attention; o projection
    decode_mlp_block         residual += x; rms_norm; gate|up projection; SiLU-and-mul; down
    decode_linear            one projection alone
    DecodeLayers             a model's layers bound once, a step's every layer in one call

Each ends at its projection's output (a tensor-parallel caller all-reduces it there). A
projection is a list of weight segments by output rows (`Projection`): a float weight in x's
dtype, or a packed one (kernels/quant_formats.py); q4_0, q4_1 and q8_0 are multiplied by the
op's own matvec, which decodes each block in registers, the others by the library's
`quant_linear`. x has 1 to `MAX_ROWS` rows (tokens), float32 or bfloat16; sums are fp32. The
torch twins are kernels/reference.py `decode_attention_block_ref`, `decode_mlp_block_ref` and
`decode_linear_ref`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixflow.kernels.cpu_build import cpu_kernels_available
from radixflow.kernels.quant_formats import BLOCKED_QTYPES

__all__ = [
    "DTYPES",
    "FAST_QTYPES",
    "MAX_ROWS",
    "AttentionWeights",
    "DecodeLayers",
    "MlpWeights",
    "PagedKV",
    "Projection",
    "decode_attention_block",
    "decode_layer_available",
    "decode_linear",
    "decode_mlp_block",
]

MAX_ROWS = 8
DTYPES = (torch.float32, torch.bfloat16)
# multiplied by the op's own matmul (the K-quants' by quant_linear's)
FAST_QTYPES = BLOCKED_QTYPES - {"q4_kx16", "q6_kx16"}


@dataclass(frozen=True)
class Projection:
    """y = x W^T (+ bias), W the segments' rows in order; qtypes[i] is "" for a float segment
    [rows, K] in x's dtype, else the ggml type of a packed uint8 [rows, row_bytes] one."""

    weights: tuple[torch.Tensor, ...]
    qtypes: tuple[str, ...]
    bias: torch.Tensor | None = None


@dataclass(frozen=True)
class AttentionWeights:
    """One layer's attention sublayer: input norm, projections, optional per-head q/k norms
    (Qwen3), head layout and the attention's knobs (as runtime/attention/base.py's spec)."""

    norm: torch.Tensor
    eps: float
    qkv: Projection
    o: Projection
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    logit_cap: float = 0.0
    sliding_window: int = -1
    int8_activations: bool = False  # q4_0/q4_1/q8_0 segments multiply x rounded to int8


@dataclass(frozen=True)
class MlpWeights:
    norm: torch.Tensor
    eps: float
    gate_up: Projection
    down: Projection
    int8_activations: bool = False  # q4_0/q4_1/q8_0 segments multiply x rounded to int8


@dataclass(frozen=True)
class PagedKV:
    """One layer's K/V pool [slots, kv_heads, head_dim] and where this step's tokens sit in it:
    token t's K/V go to slot out_cache_loc[t]; request b (token b) attends slots
    req_to_token[req_pool_indices[b], :seq_lens[b]] (int64 [B] each)."""

    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    out_cache_loc: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor


def decode_layer_available() -> bool:
    """True when the compiled ops are loaded (built on the first call of the process)."""
    return cpu_kernels_available()


def _require() -> None:
    if not decode_layer_available():
        raise RuntimeError("the CPU decode-layer ops are not available on this machine")


def decode_linear(
    x: torch.Tensor, proj: Projection, int8_activations: bool = False
) -> torch.Tensor:
    """x [M, K] (M <= MAX_ROWS) W^T + bias -> [M, N] in x's dtype; `int8_activations`: the
    q4_0/q4_1/q8_0 segments multiply x rounded per block of 32 to int8, as quant_linear."""
    _require()
    rows = sum(w.shape[0] for w in proj.weights)
    out = torch.empty(x.shape[0], rows, dtype=x.dtype)
    torch.ops.radixflow_cpu.decode_linear(
        x, proj.weights, proj.qtypes, proj.bias, out, int8_activations
    )
    return out


def decode_attention_block(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    w: AttentionWeights,
    cos_sin: torch.Tensor,
    kv: PagedKV,
) -> torch.Tensor:
    """The attention sublayer of the tokens x [T, hidden] (one per request, T <= MAX_ROWS):
    with a residual, residual += x (in place) and the norm reads it; without (the first
    layer), the norm reads x. cos_sin [T, rotary_dim] (cos | sin, x's dtype) rotates the first
    rotary_dim elements of each q and k head. Writes the tokens' K/V into the pool; returns the
    o projection's output [T, hidden]."""
    _require()
    out = torch.empty_like(x)
    torch.ops.radixflow_cpu.decode_attention_block(
        x, residual, w.norm, w.eps, w.qkv.weights, w.qkv.qtypes, w.qkv.bias, w.q_norm, w.k_norm,
        cos_sin, cos_sin.shape[1], w.num_heads, w.num_kv_heads, w.head_dim,
        kv.k_buffer, kv.v_buffer, kv.out_cache_loc, kv.req_to_token, kv.req_pool_indices,
        kv.seq_lens, w.scale, w.logit_cap, w.sliding_window, w.o.weights, w.o.qtypes, out,
        w.int8_activations,
    )  # fmt: skip
    return out


def decode_mlp_block(x: torch.Tensor, residual: torch.Tensor, w: MlpWeights) -> torch.Tensor:
    """residual += x (in place); returns down(silu_and_mul(gate_up(rms_norm(residual))))."""
    _require()
    out = torch.empty_like(x)
    torch.ops.radixflow_cpu.decode_mlp_block(
        x, residual, w.norm, w.eps, w.gate_up.weights, w.gate_up.qtypes,
        w.down.weights, w.down.qtypes, out, w.int8_activations,
    )  # fmt: skip
    return out


class DecodeLayers:
    """A model's decoder layers bound once (weights checked then) into the library's
    `DecodeLayers` object, which runs a decode step's every layer in one call: the sublayer
    pairs above in a loop in C++, without a Python call and a dispatcher trip per sublayer
    (a third of a batch-1 step's time on the default model). No all-reduce between sublayers:
    a tensor-parallel rank calls the sublayer ops one by one instead."""

    def __init__(self, layers: Sequence[tuple[AttentionWeights, MlpWeights, int]]) -> None:
        """`layers`: each layer's sublayer weights and the index of its K/V buffers in the lists
        `forward` takes."""
        _require()
        self._native = torch.classes.radixflow_cpu.DecodeLayers()
        for a, m, kv_index in layers:
            self._native.add_layer(
                a.norm, a.eps, list(a.qkv.weights), list(a.qkv.qtypes), a.qkv.bias, a.q_norm,
                a.k_norm, a.num_heads, a.num_kv_heads, a.head_dim, a.scale, a.logit_cap,
                a.sliding_window, list(a.o.weights), list(a.o.qtypes), a.int8_activations,
                m.norm, m.eps, list(m.gate_up.weights), list(m.gate_up.qtypes),
                list(m.down.weights), list(m.down.qtypes), m.int8_activations, kv_index,
            )  # fmt: skip

    def __len__(self) -> int:
        return int(self._native.num_layers())

    def warm_first(self) -> None:
        """Start pulling the first layer's weights towards the caches on a helper thread, to
        overlap single-threaded work before the next `forward` (the sampler, the engine's
        bookkeeping) with memory traffic; the next parallel matmul stops it. Within `forward`
        the layers do the same before each stretch of single-threaded work (attention, norms).
        """
        self._native.warm_first()

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: torch.Tensor,
        k_buffers: Sequence[torch.Tensor],
        v_buffers: Sequence[torch.Tensor],
        out_cache_loc: torch.Tensor,
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The embeddings x [T, hidden] (contiguous; it becomes the residual stream, updated
        in place) through every layer: (the last MLP's output, the residual stream without
        it). cos_sin and the step's K/V places as `decode_attention_block` takes them."""
        out, residual = self._native.forward(
            x, cos_sin, list(k_buffers), list(v_buffers), out_cache_loc, req_to_token,
            req_pool_indices, seq_lens,
        )  # fmt: skip
        return out, residual
