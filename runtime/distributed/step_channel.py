"""Rank 0 sends each forward's batch to the worker ranks, which rebuild it on their own pool.

Two broadcasts from rank 0 per message, on the tensor-parallel group:

    header   int64[5]   op, tokens T, requests B, logit rows L, table slots S
    payload  int64[3T + 3B + L + S]   (forwards only)
             input_ids | positions | out_cache_loc          T each
             rows | prefix_lens | extend_lens                B each
             logits_indices                                 L
             slots: req_to_token[rows[i], :seq_lens[i]] for each request, concatenated

Only the rows the step uses travel, never the whole table: a worker writes them into its own
pool's `req_to_token` at the same rows (every rank's pool has the same pages and rows, so a
slot means the same place on each) and runs the same forward as rank 0.
"""

from __future__ import annotations

import enum

import torch
import torch.distributed as dist

from radixflow.runtime.distributed.group import TPGroup
from radixflow.runtime.forward_batch import ForwardBatch
from radixflow.runtime.kv_pool import KVPool

_HEADER = 5


class Op(enum.IntEnum):
    STOP = 0  # the workers leave their loop
    FORWARD = 1  # a payload follows: run this batch
    PING = 2  # rank 0 is alive and idle (keeps the workers' wait under the group's timeout)


def _broadcast(tp: TPGroup, x: torch.Tensor) -> None:
    dist.broadcast(x, src=0, group=tp.group)


def send_op(tp: TPGroup, op: Op, device: torch.device) -> None:
    """A message without payload (STOP, PING) from rank 0."""
    _broadcast(tp, torch.tensor([op, 0, 0, 0, 0], dtype=torch.int64, device=device))


def send_forward(tp: TPGroup, batch: ForwardBatch) -> None:
    """Rank 0: send `batch` (with its requests' req_to_token rows) to the workers."""
    rows = batch.req_pool_indices
    width = max(batch.seq_lens_cpu)
    in_row = torch.arange(width, device=rows.device) < batch.seq_lens[:, None]
    slots = batch.req_to_token[rows, :width][in_row].long()
    payload = torch.cat(
        [
            batch.input_ids,
            batch.positions,
            batch.out_cache_loc,
            rows,
            batch.prefix_lens,
            batch.extend_lens,
            batch.logits_indices,
            slots,
        ]
    )
    sizes = [batch.num_tokens, batch.batch_size, len(batch.logits_indices), len(slots)]
    header = torch.tensor([Op.FORWARD, *sizes], dtype=torch.int64, device=payload.device)
    _broadcast(tp, header)
    _broadcast(tp, payload)


def recv_forward(tp: TPGroup, pool: KVPool, device: torch.device) -> ForwardBatch | None:
    """A worker: wait for rank 0's next batch, write its rows into `pool`'s table and return
    it; None when rank 0 says STOP. PINGs are consumed here."""
    header = torch.empty(_HEADER, dtype=torch.int64, device=device)
    while True:
        _broadcast(tp, header)
        op, t, b, n_logits, n_slots = header.tolist()
        if op == Op.STOP:
            return None
        if op == Op.FORWARD:
            break
        if op != Op.PING:
            raise RuntimeError(f"unknown tensor-parallel message {op} from rank 0")
    payload = torch.empty(3 * t + 3 * b + n_logits + n_slots, dtype=torch.int64, device=device)
    _broadcast(tp, payload)
    ids, positions, loc, rows, prefix, extend, logits, slots = payload.split(
        [t, t, t, b, b, b, n_logits, n_slots]
    )
    prefix_cpu, extend_cpu = prefix.tolist(), extend.tolist()
    seq = prefix + extend
    width = max(p + n for p, n in zip(prefix_cpu, extend_cpu, strict=True))
    in_row = torch.arange(width, device=device) < seq[:, None]
    table = pool.req_to_token
    block = table[rows, :width]
    block[in_row] = slots.to(table.dtype)
    table[rows, :width] = block
    return ForwardBatch.build(
        ids.tolist(),
        positions,
        loc,
        table,
        rows.tolist(),
        prefix_cpu,
        extend_cpu,
        logits,
        device,
    )
