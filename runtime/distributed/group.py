"""The tensor-parallel group a rank belongs to: its rank, the group's size and the collectives
the sharded layers call (torch.distributed: NCCL on CUDA, gloo on the CPU).

`TPGroup.single()` is the one-device case: every collective is the identity, so a model built
for it runs exactly as without tensor parallelism.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 120.0  # a collective waiting longer means a peer is gone


@dataclass(frozen=True)
class TPGroup:
    rank: int
    size: int
    group: dist.ProcessGroup | None = None

    @classmethod
    def single(cls) -> TPGroup:
        return cls(rank=0, size=1)

    @property
    def is_driver(self) -> bool:
        """Rank 0 schedules and samples; the others run the forwards it sends."""
        return self.rank == 0

    def shard(self, n: int) -> tuple[int, int]:
        """This rank's [start, end) of `n` items split evenly (n must divide by the size)."""
        if n % self.size:
            raise ValueError(f"{n} does not split evenly over {self.size} tensor-parallel ranks")
        part = n // self.size
        return self.rank * part, (self.rank + 1) * part

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; returns it."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `x` (same shape on each) concatenated along `dim`, in rank order."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def min_over_ranks(self, value: int, device: torch.device) -> int:
        """The smallest of the ranks' `value`s, on every rank (`device`: where the group's
        collectives run, cuda for NCCL)."""
        if self.size == 1:
            return value
        x = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(x, op=dist.ReduceOp.MIN, group=self.group)
        return int(x.item())


def init_tp_group(
    rank: int,
    size: int,
    init_method: str,
    device: torch.device,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TPGroup:
    """Join the default process group of `size` ranks at `init_method` (`tcp://host:port`):
    NCCL on CUDA (this rank's device set first), gloo on the CPU."""
    if size == 1:
        return TPGroup.single()
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return TPGroup(rank=rank, size=size, group=dist.group.WORLD)


def exit_rank_process(code: int) -> None:
    """End a tensor-parallel rank's process: leave the group, flush, and exit without the
    interpreter's finalization.

    Gloo's worker threads drop their last references to a collective's tensors just after the
    collective returns. One doing so while Python 3.11 finalizes has to take the GIL, is ended
    with pthread_exit, and the forced unwind through a noexcept destructor aborts the process
    (std::terminate, SIGABRT): a rank that finished its work would report a crash.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
