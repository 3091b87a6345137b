"""Plain paged attention, obviously correct and slow: the twin every backend is tested against.

For each request it gathers the whole K/V sequence through req_to_token (cached prefix, then the
new tokens just stored), and runs causal softmax attention in fp32, one request at a time:
kernels/reference.py `store_kv_ref` and `extend_attention_ref` (a decode row is an extend of
one token). GQA, logit soft-capping and sliding windows follow the layer spec.
"""

from __future__ import annotations

import torch

from radixflow.kernels.reference import extend_attention_ref, store_kv_ref
from radixflow.runtime.attention.base import AttentionBackend, AttentionLayerSpec
from radixflow.runtime.forward_batch import ForwardBatch
from radixflow.runtime.kv_pool import KVPool


class ReferenceBackend(AttentionBackend):
    def __init__(self, pool: KVPool) -> None:
        self.pool = pool

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Nothing to precompute: every call reads the batch afresh."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayerSpec,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        h, kvh, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        k_buf = self.pool.k_buffers[layer.layer_id]
        v_buf = self.pool.v_buffers[layer.layer_id]
        k3, v3 = k.reshape(-1, kvh, d), v.reshape(-1, kvh, d)
        store_kv_ref(k_buf, v_buf, batch.out_cache_loc, k3, v3)
        out = extend_attention_ref(
            q.reshape(-1, h, d), k3.to(k_buf.dtype), v3.to(v_buf.dtype), k_buf, v_buf,
            batch.req_to_token, batch.req_pool_indices, batch.prefix_lens, batch.extend_lens,
            batch.extend_start, layer.scaling, layer.logit_cap, layer.sliding_window,
        )  # fmt: skip
        return out.reshape(q.shape[0], h * d)
