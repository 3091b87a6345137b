"""Requests on a real KVPool with their whole K/V history kept aside, and dense fp32 attention
over that history: the reference every attention backend is checked against."""

from __future__ import annotations

import math

import torch

from radixflow.kernels.testing import relative_error
from radixflow.runtime.attention.base import AttentionBackend, AttentionLayerSpec
from radixflow.runtime.forward_batch import ForwardBatch, ForwardMode
from radixflow.runtime.kv_pool import KVPool

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    layer: AttentionLayerSpec,
) -> torch.Tensor:
    """q [n, H, D] at positions q_pos over the whole sequence k, v [L, KVH, D]; plain fp32 math."""
    group = HEADS // KV_HEADS
    k = k.float().repeat_interleave(group, 1)
    v = v.float().repeat_interleave(group, 1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * layer.scaling
    if layer.logit_cap > 0:
        scores = layer.logit_cap * torch.tanh(scores / layer.logit_cap)
    k_pos = torch.arange(k.shape[0])[None, :]
    visible = k_pos <= q_pos[:, None]
    if layer.sliding_window > 0:
        visible &= k_pos > q_pos[:, None] - layer.sliding_window
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hnl,lhd->nhd", probs, v).reshape(q.shape[0], -1)


class Harness:
    """Requests on a KVPool, with the whole K/V history of each kept aside for the reference."""

    def __init__(
        self,
        page_size: int,
        num_layers: int,
        gen: torch.Generator,
        *,
        num_tokens: int = 64,
        max_reqs: int = 6,
        max_context: int = 96,
    ) -> None:
        self.gen = gen
        self.pool = KVPool(
            num_layers=num_layers, num_pages=num_tokens // page_size + 8, page_size=page_size,
            num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype=torch.float32, device="cpu",
            max_reqs=max_reqs, max_context=max_context,
        )  # fmt: skip
        everything = self.pool.alloc_pages(self.pool.available())
        order = torch.randperm(len(everything), generator=gen).tolist()
        self.pool.free_pages([everything[j] for j in order])  # pages now come out scattered
        self.rows: list[int] = []
        self.capacity: list[torch.Tensor] = []  # slots of the pages each request holds
        self.lengths: list[int] = []
        self.history: list[list[tuple[torch.Tensor, torch.Tensor]]] = []  # [req][layer] (K, V)

    def add_request(self, cached: int) -> None:
        """A request whose first `cached` tokens are already in the pool (a radix-cache hit)."""
        row = self.pool.alloc_row()
        assert row is not None
        self.rows.append(row)
        self.capacity.append(torch.empty(0, dtype=torch.int64))
        self.lengths.append(0)
        slots = self._grow(len(self.rows) - 1, cached)
        self.history.append([])
        for layer in range(self.pool.num_layers):
            k = torch.randn(cached, KV_HEADS, HEAD_DIM, generator=self.gen)
            v = torch.randn(cached, KV_HEADS, HEAD_DIM, generator=self.gen)
            self.pool.k_buffers[layer][slots], self.pool.v_buffers[layer][slots] = k, v
            self.history[-1].append((k, v))

    def fork_request(self, source: int, shared: int) -> None:
        """A request whose first `shared` tokens are request `source`'s own slots (a prefix
        shared through the radix cache; page-aligned, as the cache matches whole pages)."""
        assert shared % self.pool.page_size == 0 and shared <= self.lengths[source]
        row = self.pool.alloc_row()
        assert row is not None
        self.rows.append(row)
        self.capacity.append(self.capacity[source][:shared].clone())
        self.lengths.append(shared)
        self.pool.req_to_token[row, :shared] = self.capacity[-1].int()
        self.history.append([(k[:shared], v[:shared]) for k, v in self.history[source]])

    def _grow(self, i: int, n: int) -> torch.Tensor:
        """Give request i slots for n more tokens; returns the new slots."""
        page = self.pool.page_size
        have, need = self.lengths[i], self.lengths[i] + n
        missing = math.ceil(need / page) - self.capacity[i].numel() // page
        if missing > 0:
            pages = self.pool.alloc_pages(missing)
            assert pages is not None
            self.capacity[i] = torch.cat([self.capacity[i], self.pool.slots_of_pages(pages)])
        self.lengths[i] = need
        slots = self.capacity[i][:need]
        self.pool.req_to_token[self.rows[i], :need] = slots.int()
        return slots[have:]

    def step(self, extend_lens: list[int], mode: ForwardMode) -> ForwardBatch:
        prefix_lens = list(self.lengths)
        new_slots = [self._grow(i, n) for i, n in enumerate(extend_lens)]
        seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens, strict=True)]
        positions = torch.cat(
            [torch.arange(p, s) for p, s in zip(prefix_lens, seq_lens, strict=True)]
        )
        num_tokens = int(positions.numel())
        return ForwardBatch(
            mode=mode,
            input_ids=torch.zeros(num_tokens, dtype=torch.int64),
            positions=positions,
            out_cache_loc=torch.cat(new_slots),
            req_to_token=self.pool.req_to_token,
            req_pool_indices=torch.tensor(self.rows),
            seq_lens=torch.tensor(seq_lens),
            prefix_lens=torch.tensor(prefix_lens),
            extend_lens=torch.tensor(extend_lens),
            seq_lens_cpu=seq_lens,
            prefix_lens_cpu=prefix_lens,
            extend_lens_cpu=extend_lens,
            logits_indices=torch.cumsum(torch.tensor(extend_lens), 0) - 1,
        )

    def check_forward(
        self, backend: AttentionBackend, batch: ForwardBatch, layer: AttentionLayerSpec
    ):
        num_tokens = batch.num_tokens
        width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
        qkv = torch.randn(num_tokens, width, generator=self.gen)
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=1)
        out = backend.forward(q, k, v, layer, batch)

        lid = layer.layer_id
        k3, v3 = (
            k.reshape(num_tokens, KV_HEADS, HEAD_DIM),
            v.reshape(num_tokens, KV_HEADS, HEAD_DIM),
        )
        assert torch.equal(self.pool.k_buffers[lid][batch.out_cache_loc], k3)
        assert torch.equal(self.pool.v_buffers[lid][batch.out_cache_loc], v3)
        expect = torch.empty_like(out)
        start = 0
        for i, n in enumerate(batch.extend_lens_cpu):
            old_k, old_v = self.history[i][lid]
            full_k = torch.cat([old_k, k3[start : start + n]])
            full_v = torch.cat([old_v, v3[start : start + n]])
            self.history[i][lid] = (full_k, full_v)
            q_i = q[start : start + n].reshape(n, HEADS, HEAD_DIM)
            expect[start : start + n] = dense_attention(
                q_i, full_k, full_v, batch.positions[start : start + n], layer
            )
            start += n
        assert out.shape == (num_tokens, HEADS * HEAD_DIM)
        assert not out.isnan().any()
        assert relative_error(out, expect) < 1e-5
