"""Attention through the Triton kernels: store new K/V in the pool, then decode/extend attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixflow.kernels.decode_attention import choose_num_kv_splits, decode_attention
from radixflow.kernels.extend_attention import extend_attention
from radixflow.kernels.store_kv import store_kv
from radixflow.runtime.attention.base import AttentionBackend, AttentionLayerSpec
from radixflow.runtime.forward_batch import ForwardBatch, ForwardMode
from radixflow.runtime.kv_pool import KVPool


@dataclass(frozen=True)
class _BatchMetadata:
    batch: ForwardBatch
    extend_start: torch.Tensor  # [B] int64 (EXTEND)
    max_extend_len: int  # grid size of extend attention
    num_kv_splits: int  # slices per request in decode attention


class TritonBackend(AttentionBackend):
    """AttentionBackend over a KVPool with the Triton kernels (CUDA, or CPU under TRITON_INTERPRET).

    num_kv_splits fixes the decode split count (needed when capturing CUDA graphs); None picks
    it per batch from the longest sequence.
    """

    def __init__(self, pool: KVPool, num_kv_splits: int | None = None) -> None:
        if num_kv_splits is not None and num_kv_splits < 1:
            raise ValueError(f"num_kv_splits must be positive, got {num_kv_splits}")
        self.pool = pool
        self.num_kv_splits = num_kv_splits
        self._meta: _BatchMetadata | None = None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        num_kv_heads = self.pool.k_buffers[0].shape[1]
        if self.num_kv_splits is not None:
            splits = self.num_kv_splits
        else:
            max_len = max(batch.seq_lens_cpu, default=1)
            splits = choose_num_kv_splits(batch.batch_size * num_kv_heads, max_len)
        self._meta = _BatchMetadata(
            batch=batch,
            extend_start=batch.extend_start,
            max_extend_len=max(batch.extend_lens_cpu, default=0),
            num_kv_splits=splits,
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayerSpec,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        meta = self._meta
        if meta is None or meta.batch is not batch:
            raise RuntimeError("call init_forward_metadata(batch) before forward(..., batch)")
        k_buffer = self.pool.k_buffers[layer.layer_id]
        v_buffer = self.pool.v_buffers[layer.layer_id]
        if k_buffer.shape[1:] != (layer.num_kv_heads, layer.head_dim):
            raise ValueError(
                f"layer {layer.layer_id}: {layer.num_kv_heads} KV heads of dim {layer.head_dim}, "
                f"but the pool holds {tuple(k_buffer.shape[1:])}"
            )
        if q.dtype != k_buffer.dtype:
            raise ValueError(f"q is {q.dtype} but the KV pool is {k_buffer.dtype}")
        num_tokens = q.shape[0]
        q3 = q.reshape(num_tokens, layer.num_heads, layer.head_dim)
        k3 = k.reshape(num_tokens, layer.num_kv_heads, layer.head_dim)
        v3 = v.reshape(num_tokens, layer.num_kv_heads, layer.head_dim)
        store_kv(k_buffer, v_buffer, batch.out_cache_loc, k3, v3)

        if batch.mode is ForwardMode.DECODE:
            o = decode_attention(
                q3, k_buffer, v_buffer, batch.req_to_token, batch.req_pool_indices,
                batch.seq_lens, layer.scaling, layer.logit_cap, layer.sliding_window,
                num_kv_splits=meta.num_kv_splits,
            )  # fmt: skip
        else:
            o = extend_attention(
                q3, k3, v3, k_buffer, v_buffer, batch.req_to_token, batch.req_pool_indices,
                batch.prefix_lens, batch.extend_lens, meta.extend_start,
                layer.scaling, layer.logit_cap, layer.sliding_window,
                max_extend_len=meta.max_extend_len,
            )  # fmt: skip
        return o.view(num_tokens, layer.num_heads * layer.head_dim)
