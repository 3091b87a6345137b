"""Paged KV storage: per-layer K/V buffers, a free-page allocator and the req_to_token table.

k_buffers[layer]  [num_pages * page_size, kv_heads, head_dim]
                   slot s lives in page s // page_size; page 0 is reserved (padding writes)
req_to_token      [max_reqs, max_context] int32: row r, column j = slot of token j of the
                   request holding row r

The K/V buffers may be allocated after the pool is made (`allocate`): the engine sizes them
once the weights are loaded (runtime/memory_plan.py). On the CPU every buffer is an anonymous
mapping: zero-filled by the OS, its pages taken from RAM only when first written, so the
process's memory follows the tokens cached, not the pool's size.
"""

from __future__ import annotations

import math
import mmap

import torch

from radixflow.runtime.memory_plan import kv_bytes_per_token


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor; on the CPU backed by an anonymous mapping (committed when written)."""
    numel = math.prod(shape)
    if device.type != "cpu" or numel == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    try:
        mapping = mmap.mmap(-1, numel * dtype.itemsize)
    except OSError as exc:
        raise ValueError(
            f"cannot map {numel * dtype.itemsize / 2**30:.2f} GiB for the KV pool ({exc}): "
            "lower mem_fraction_static or set max_total_tokens"
        ) from exc
    return torch.frombuffer(mapping, dtype=dtype, count=numel).view(shape)


class KVPool:
    def __init__(
        self,
        *,
        num_layers: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        max_reqs: int,
        max_context: int,
        num_pages: int | None = None,
    ) -> None:
        """`num_pages` None: no K/V storage until `allocate(num_pages)`."""
        if page_size < 1:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.page_size = page_size
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.num_pages = 0
        self.k_buffers: list[torch.Tensor] = []
        self.v_buffers: list[torch.Tensor] = []
        self._free_pages: list[int] = []
        self.req_to_token = zeroed((max_reqs, max_context), torch.int32, self.device)
        self._free_rows: list[int] = list(range(max_reqs - 1, -1, -1))
        if num_pages is not None:
            self.allocate(num_pages)

    def allocate(self, num_pages: int) -> None:
        """Make the K/V buffers, once."""
        if self.k_buffers:
            raise RuntimeError("the KV pool is already allocated")
        if num_pages < 2:
            raise ValueError(f"num_pages must be at least 2, got {num_pages}")
        shape = (num_pages * self.page_size, self.num_kv_heads, self.head_dim)
        self.k_buffers = [zeroed(shape, self.dtype, self.device) for _ in range(self.num_layers)]
        self.v_buffers = [zeroed(shape, self.dtype, self.device) for _ in range(self.num_layers)]
        self.num_pages = num_pages
        self._free_pages = list(range(num_pages - 1, 0, -1))  # pop() gives low pages

    # -- pages -----------------------------------------------------------------------------
    @property
    def capacity_pages(self) -> int:
        return max(self.num_pages - 1, 0)

    @property
    def capacity_tokens(self) -> int:
        """The most tokens the pool's KV can hold at once (page 0 excluded)."""
        return self.capacity_pages * self.page_size

    def available(self) -> int:
        """Free pages."""
        return len(self._free_pages)

    def alloc_pages(self, n: int) -> list[int] | None:
        """Take n free pages, or None (and take nothing) when fewer are free."""
        if n > len(self._free_pages):
            return None
        if n == 0:
            return []
        taken = self._free_pages[-n:]
        del self._free_pages[-n:]
        return taken[::-1]

    def free_pages(self, pages: list[int]) -> None:
        self._free_pages.extend(pages)

    def free(self, slots: torch.Tensor) -> None:
        """Free the pages holding these slots (a run covering whole pages, page aligned)."""
        if slots.numel():
            self.free_pages(torch.unique(slots // self.page_size).tolist())

    def slots_of_pages(self, pages: list[int]) -> torch.Tensor:
        """All slots of the given pages, in order."""
        base = torch.tensor(pages, dtype=torch.int64) * self.page_size
        return (base[:, None] + torch.arange(self.page_size)).reshape(-1)

    # -- request rows ------------------------------------------------------------------------
    @property
    def max_context(self) -> int:
        return int(self.req_to_token.shape[1])

    def alloc_row(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    def rows_available(self) -> int:
        return len(self._free_rows)

    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)
