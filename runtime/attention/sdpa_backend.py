"""Optimised paged attention in torch: SDPA, the compiled CPU decode kernel, cascade decoding.

This is the `--attention-backend torch` choice (the CPU default). Its plain, obviously correct
twin is attention/reference.py; tests compare the two on random paged batches. One file of
about 400 lines: the decode, cascade and extend paths share their per-batch row metadata.

Rows with one new token (decode, or the decode part of a mixed batch) are attended by the
compiled CPU kernel (kernels/cpu_attention.py), which reads K/V straight from the pool through
req_to_token, in one call; where it is not available, in batched SDPA calls over K/V gathered
through req_to_token and padded to the longest sequence of their group. Rows with several new
tokens (prefill chunks) are attended one request at a time.

Cascade decoding: decode rows whose sequences start with the same KV slots (a radix-cache hit:
few-shot examples, a system prompt, the branches of a fork) attend to that shared prefix in one
call, all their query heads stacked as one long query, so the prefix is read once instead of
once per row; each row's own tail is attended separately and the two halves are merged by
their log-sum-exp. The prefix call is a matrix product where the per-row one was a
matrix-vector product, which is what makes it fast on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from radixflow.kernels import cpu_attention
from radixflow.runtime.attention.base import AttentionBackend, AttentionLayerSpec
from radixflow.runtime.forward_batch import ForwardBatch
from radixflow.runtime.kv_pool import KVPool

MAX_DECODE_GROUPS = 4
MIN_DECODE_GROUP = 16  # smaller groups cost more in per-call overhead than padding saves
MAX_CASCADE_GROUPS = 4
MIN_CASCADE_PREFIX = 64  # a shorter shared prefix saves less than the extra calls cost
# Extends up to this many tokens (speculative verification, jump-forward) run in the decode
# kernel, one query row per token, each seeing the keys up to its own position.
KERNEL_MAX_EXTEND = 16


@dataclass
class _DecodeRows:
    token_index: torch.Tensor  # [Bd] token rows of these requests
    head_rows: torch.Tensor  # [Bd * kv_heads * L] rows of the [slots * kv_heads, D] view
    valid: torch.Tensor  # [Bd, 1, 1, L] bool
    bias: torch.Tensor  # [Bd, 1, 1, L] 0 where valid, -inf elsewhere (the pool's dtype)
    seq_lens: torch.Tensor  # [Bd]
    max_len: int


@dataclass
class _KernelRows:
    """Decode rows for the compiled kernel: it needs no gather index and no padding."""

    token_index: torch.Tensor  # [Bd] token rows of these requests
    table: torch.Tensor  # req_to_token, or its columns from `skip` on
    pool_rows: torch.Tensor  # [Bd] their rows of the table
    seq_lens: torch.Tensor  # [Bd] keys to attend, counted from the table's first column


_Rows = _DecodeRows | _KernelRows


@dataclass
class _CascadeRows:
    token_index: torch.Tensor  # [Bc] token rows of these requests
    prefix_rows: torch.Tensor  # [kv_heads * prefix_len] rows of the shared prefix
    prefix_len: int
    tails: _Rows  # each request's tokens after the prefix
    ids: list[int]  # their rows in the batch
    whole: _Rows | None = None  # unsplit, built for soft-capped or windowed layers


@dataclass
class _ExtendRow:
    start: int  # first token row
    length: int  # new tokens
    prefix_len: int
    head_rows: torch.Tensor  # [kv_heads * (prefix_len + length)] rows of the [.., D] view
    masks: dict[int, torch.Tensor] = field(default_factory=dict)  # causal mask by window


class TorchPagedBackend(AttentionBackend):
    """use_kernel=False keeps decode rows on the SDPA path even where the kernel builds;
    cascade=False attends every decode row over its whole sequence (benchmarks compare both)."""

    def __init__(self, pool: KVPool, use_kernel: bool = True, cascade: bool = True) -> None:
        self.pool = pool
        self._decode: list[_Rows] = []
        self._cascade: list[_CascadeRows] = []
        self._batch: ForwardBatch | None = None
        self._decode_only = False
        # the flash kernel that also returns the log-sum-exp is CPU-only
        self._can_cascade = cascade and pool.device.type == "cpu"
        self._kernel = (
            use_kernel
            and pool.device.type == "cpu"
            and cpu_attention.supports(pool.dtype, pool.head_dim)
        )
        self._extend: list[_ExtendRow] = []

    @property
    def uses_kernel(self) -> bool:
        """Decode rows go to the compiled CPU kernel (runtime/layers/decode_block.py asks)."""
        return self._kernel

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        table = batch.req_to_token
        rows = batch.req_pool_indices
        decode_ids = [i for i, n in enumerate(batch.extend_lens_cpu) if n == 1]
        self._batch = batch
        self._cascade = []
        if self._can_cascade and len(decode_ids) > 1:
            families = _shared_prefixes(batch, decode_ids)
            self._cascade = [self._cascade_rows(batch, ids, n) for ids, n in families]
            shared = {i for ids, _ in families for i in ids}
            decode_ids = [i for i in decode_ids if i not in shared]
        short: set[int] = set()
        if self._kernel:
            short = {i for i, n in enumerate(batch.extend_lens_cpu) if 1 < n <= KERNEL_MAX_EXTEND}
            rows_in = sorted(set(decode_ids) | short)
            self._decode = [self._kernel_rows(batch, rows_in, queries=True)] if rows_in else []
            decode_ids = rows_in
        else:
            # Decode rows are grouped by length so padding to each group's longest stays small.
            groups = min(MAX_DECODE_GROUPS, -(-len(decode_ids) // MIN_DECODE_GROUP))
            if groups > 1:
                decode_ids.sort(key=lambda i: batch.seq_lens_cpu[i])
            size = max(1, -(-len(decode_ids) // max(groups, 1)))
            self._decode = [
                self._decode_rows(batch, decode_ids[g : g + size])
                for g in range(0, len(decode_ids), size)
            ]
        self._decode_only = len(decode_ids) == batch.batch_size and len(self._decode) == 1
        self._extend = []
        start = 0
        for i, n in enumerate(batch.extend_lens_cpu):
            if n != 1 and i not in short:
                row = int(rows[i])
                seq = batch.seq_lens_cpu[i]
                slots = table[row, :seq].to(torch.int64)
                rows_i = self._head_rows(slots[None])
                self._extend.append(_ExtendRow(start, n, batch.prefix_lens_cpu[i], rows_i))
            start += n

    def _decode_rows(self, batch: ForwardBatch, ids: list[int], skip: int = 0) -> _DecodeRows:
        """Rows `ids` over their sequences from position `skip` on, padded to the longest."""
        device = batch.seq_lens.device
        idx = torch.tensor(ids, device=device)
        seq_lens = batch.seq_lens.index_select(0, idx) - skip
        max_len = max(batch.seq_lens_cpu[i] for i in ids) - skip
        valid = torch.arange(max_len, device=device)[None, :] < seq_lens[:, None]
        rows = batch.req_pool_indices.index_select(0, idx)
        table = batch.req_to_token.index_select(0, rows)
        slots = table[:, skip : skip + max_len].to(torch.int64)
        slots = slots.masked_fill(~valid, 0)  # padding reads slot 0, masked out
        valid = valid[:, None, None, :]
        bias = torch.zeros(valid.shape, dtype=self.pool.k_buffers[0].dtype, device=device)
        return _DecodeRows(
            batch.extend_start.index_select(0, idx),
            self._head_rows(slots),
            valid,
            bias.masked_fill_(~valid, float("-inf")),
            seq_lens,
            max_len,
        )

    def _kernel_rows(
        self, batch: ForwardBatch, ids: list[int], skip: int = 0, queries: bool = False
    ) -> _KernelRows:
        """Rows `ids` over their sequences from position `skip` on, for the compiled kernel;
        with `queries`, a row of several new tokens becomes one query per token (causal)."""
        if not queries:
            idx = torch.tensor(ids)
            return _KernelRows(
                batch.extend_start.index_select(0, idx),
                batch.req_to_token[:, skip:],
                batch.req_pool_indices.index_select(0, idx),
                batch.seq_lens.index_select(0, idx) - skip,
            )
        starts = batch.extend_start.tolist()
        tokens, pool_rows, seq_lens = [], [], []
        for i in ids:
            n, seq, row = batch.extend_lens_cpu[i], batch.seq_lens_cpu[i], batch.req_pool_indices[i]
            tokens += range(starts[i], starts[i] + n)
            pool_rows += [row] * n
            seq_lens += range(seq - n + 1, seq + 1)
        return _KernelRows(
            torch.tensor(tokens),
            batch.req_to_token,
            torch.stack(pool_rows),
            torch.tensor(seq_lens),
        )

    def _rows(self, batch: ForwardBatch, ids: list[int], skip: int = 0) -> _Rows:
        if self._kernel:
            return self._kernel_rows(batch, ids, skip)
        return self._decode_rows(batch, ids, skip)

    def _cascade_rows(self, batch: ForwardBatch, ids: list[int], prefix_len: int) -> _CascadeRows:
        row = int(batch.req_pool_indices[ids[0]])
        prefix = batch.req_to_token[row, :prefix_len].to(torch.int64)
        return _CascadeRows(
            batch.extend_start.index_select(0, torch.tensor(ids)),
            self._head_rows(prefix[None]),
            prefix_len,
            self._rows(batch, ids, skip=prefix_len),
            ids,
        )

    def _head_rows(self, slots: torch.Tensor) -> torch.Tensor:
        """Gather index giving [B, kv_heads, L, D] straight from the pool's [S * kv_heads, D]
        view, so attention reads contiguous per-head keys without a transpose copy."""
        kvh = self.pool.k_buffers[0].shape[1]
        heads = torch.arange(kvh, device=slots.device)
        return (slots[:, None, :] * kvh + heads[None, :, None]).reshape(-1)

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
        k_buf.index_copy_(0, batch.out_cache_loc, k.reshape(-1, kvh, d).to(k_buf.dtype))
        v_buf.index_copy_(0, batch.out_cache_loc, v.reshape(-1, kvh, d).to(v_buf.dtype))
        if self._decode_only:  # one group in token order: no scatter needed
            return self._attend_decode(q, k_buf, v_buf, layer, self._decode[0])
        out = torch.empty_like(q)
        for cas in self._cascade:
            out[cas.token_index] = self._attend_cascade(
                q[cas.token_index], k_buf, v_buf, layer, cas
            )
        for dec in self._decode:
            out[dec.token_index] = self._attend_decode(q[dec.token_index], k_buf, v_buf, layer, dec)
        for row in self._extend:
            qr = q[row.start : row.start + row.length].reshape(row.length, h, d).transpose(0, 1)
            seq = row.prefix_len + row.length
            kr = gather_rows(k_buf.view(-1, d), row.head_rows).view(kvh, seq, d)
            vr = gather_rows(v_buf.view(-1, d), row.head_rows).view(kvh, seq, d)
            mask = None  # no prefix, no window, no cap: SDPA's own causal mask skips blocks
            if row.prefix_len or layer.sliding_window > 0 or layer.logit_cap > 0:
                mask = row.masks.get(layer.sliding_window)
                if mask is None:  # built once per forward, not once per layer
                    mask = _causal_mask(row.prefix_len, row.length, layer.sliding_window, q.device)
                    row.masks[layer.sliding_window] = mask
            o = _sdpa(qr[None], kr[None].to(q.dtype), vr[None].to(q.dtype), mask, layer)
            out[row.start : row.start + row.length] = o[0].transpose(0, 1).reshape(row.length, -1)
        return out

    def _attend_decode(
        self,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        layer: AttentionLayerSpec,
        dec: _Rows,
    ) -> torch.Tensor:
        if isinstance(dec, _KernelRows):
            o, _ = _attend_kernel(q, k_buf, v_buf, layer, dec, with_lse=False)
            return o.reshape(q.shape[0], -1)
        b, kvh, d = q.shape[0], layer.num_kv_heads, layer.head_dim
        group = layer.num_heads // kvh
        # Query heads of one KV head sit in the "query length" axis, so no K/V repeat is needed.
        qd = q.reshape(b, kvh, group, d)
        kd = gather_rows(k_buf.view(-1, d), dec.head_rows).view(b, kvh, dec.max_len, d)
        vd = gather_rows(v_buf.view(-1, d), dec.head_rows).view(b, kvh, dec.max_len, d)
        mask = dec.bias  # additive: SDPA skips converting a boolean mask for every layer
        if layer.sliding_window > 0 or layer.logit_cap > 0:
            mask = dec.valid
        if layer.sliding_window > 0:
            first = (dec.seq_lens - layer.sliding_window)[:, None, None, None]
            mask = mask & (torch.arange(dec.max_len, device=first.device) >= first)
        o = _sdpa(qd, kd.to(q.dtype), vd.to(q.dtype), mask, layer, gqa=False)
        return o.reshape(b, -1)

    def _attend_cascade(
        self,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        layer: AttentionLayerSpec,
        cas: _CascadeRows,
    ) -> torch.Tensor:
        if layer.logit_cap > 0 or layer.sliding_window > 0:  # neither splits into two halves
            if cas.whole is None:
                cas.whole = self._rows(self._batch, cas.ids)
            return self._attend_decode(q, k_buf, v_buf, layer, cas.whole)
        b, kvh, d = q.shape[0], layer.num_kv_heads, layer.head_dim
        group = layer.num_heads // kvh
        qd = q.reshape(b, kvh, group, d)
        n = cas.prefix_len
        kp = gather_rows(k_buf.view(-1, d), cas.prefix_rows).view(1, kvh, n, d).to(q.dtype)
        vp = gather_rows(v_buf.view(-1, d), cas.prefix_rows).view(1, kvh, n, d).to(q.dtype)
        stacked = qd.transpose(0, 1).reshape(1, kvh, b * group, d)
        o_pre, lse_pre = _flash_with_lse(stacked, kp, vp, None, layer.scaling)
        o_pre = o_pre.view(kvh, b, group, d).transpose(0, 1)
        lse_pre = lse_pre.view(kvh, b, group).transpose(0, 1)
        tails = cas.tails
        if isinstance(tails, _KernelRows):
            o_tail, lse_tail = _attend_kernel(q, k_buf, v_buf, layer, tails, with_lse=True)
            o_tail, lse_tail = o_tail.view(b, kvh, group, d), lse_tail.view(b, kvh, group)
        else:
            kt = gather_rows(k_buf.view(-1, d), tails.head_rows).view(b, kvh, tails.max_len, d)
            vt = gather_rows(v_buf.view(-1, d), tails.head_rows).view(b, kvh, tails.max_len, d)
            o_tail, lse_tail = _flash_with_lse(
                qd, kt.to(q.dtype), vt.to(q.dtype), tails.bias.to(q.dtype), layer.scaling
            )
        top = torch.maximum(lse_pre, lse_tail)
        w_pre, w_tail = (lse_pre - top).exp_()[..., None], (lse_tail - top).exp_()[..., None]
        merged = (o_pre.float() * w_pre + o_tail.float() * w_tail) / (w_pre + w_tail)
        return merged.to(q.dtype).reshape(b, -1)


def _attend_kernel(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    layer: AttentionLayerSpec,
    rows: _KernelRows,
    with_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """o [b, H, D] in q's dtype and, when asked, the log-sum-exp [b, H] (float32)."""
    b = q.shape[0]
    qk = q.reshape(b, layer.num_heads, layer.head_dim).to(k_buf.dtype)
    lse = torch.empty(b, layer.num_heads) if with_lse else None
    o = cpu_attention.decode_attention_cpu(
        qk, k_buf, v_buf, rows.table, rows.pool_rows, rows.seq_lens, layer.scaling,
        layer.logit_cap, layer.sliding_window, lse=lse,
    )  # fmt: skip
    return o.to(q.dtype), lse


def _shared_prefixes(batch: ForwardBatch, ids: list[int]) -> list[tuple[list[int], int]]:
    """Families of decode rows whose sequences start with the same slots, with the length they
    share (at least MIN_CASCADE_PREFIX, and short of each row's own newest token); the
    MAX_CASCADE_GROUPS families that save the most reads."""
    seq_lens = torch.tensor([batch.seq_lens_cpu[i] for i in ids])
    width = int(seq_lens.max())
    rows = batch.req_pool_indices.index_select(0, torch.tensor(ids))
    slots = batch.req_to_token.index_select(0, rows)[:, :width]
    in_prefix = torch.arange(width)[None, :] < (seq_lens - 1)[:, None]
    families = []
    firsts, family_of = torch.unique(slots[:, 0], return_inverse=True)
    for f in range(len(firsts)):
        members = (family_of == f).nonzero().flatten()
        if len(members) < 2:
            continue
        same = (slots[members] == slots[members[0]]) & in_prefix[members] & in_prefix[members[0]]
        shared = same.int().cumprod(1).sum(1)
        keep = shared >= MIN_CASCADE_PREFIX
        if int(keep.sum()) < 2:
            continue
        length = int(shared[keep].min())
        families.append(([ids[m] for m in members[keep].tolist()], length))
    families.sort(key=lambda fam: (len(fam[0]) - 1) * fam[1], reverse=True)
    return families[:MAX_CASCADE_GROUPS]


def gather_rows(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """buffer[slots] along dim 0; rows are copied as int64 words, which CPU index_select
    does several times faster than bf16 or fp32 elements."""
    flat = buffer.view(buffer.shape[0], -1)
    if (flat.shape[1] * flat.element_size()) % 8:
        return buffer.index_select(0, slots)
    rows = flat.view(torch.int64).index_select(0, slots)
    return rows.view(buffer.dtype).view(-1, *buffer.shape[1:])


def _flash_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output and the log-sum-exp of its scores per query (float32)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, attn_mask=mask, scale=scale
    )


def _causal_mask(prefix_len: int, length: int, window: int, device: torch.device) -> torch.Tensor:
    """[length, prefix_len + length] bool: query i sees keys j <= prefix_len + i (and in window)."""
    q_pos = torch.arange(length, device=device)[:, None] + prefix_len
    k_pos = torch.arange(prefix_len + length, device=device)[None, :]
    mask = k_pos <= q_pos
    if window > 0:
        mask &= k_pos > q_pos - window
    return mask


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    layer: AttentionLayerSpec,
    gqa: bool = True,
) -> torch.Tensor:
    """Attention of q over k/v; mask None means causal over equally long q and k."""
    if layer.logit_cap > 0:
        if gqa and q.shape[1] != k.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q.float() @ k.float().transpose(-1, -2)) * layer.scaling
        scores = layer.logit_cap * torch.tanh(scores / layer.logit_cap)
        scores = scores.masked_fill(~mask, float("-inf"))
        return (scores.softmax(-1) @ v.float()).to(q.dtype)
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        is_causal=mask is None,
        scale=layer.scaling,
        enable_gqa=gqa and q.shape[1] != k.shape[1],
    )
