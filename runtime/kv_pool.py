"""Paged KV storage: per-layer K/V buffers, a free-page allocator and the req_to_token table.

k_buffers[layer]  [num_pages * page_size, kv_heads, head_dim]
                   slot s lives in page s // page_size; page 0 is reserved (padding writes)
req_to_token      [max_reqs, max_context] int32: row r, column j = slot of token j of the
                   request holding row r
"""

from __future__ import annotations

import torch


class KVPool:
    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        max_reqs: int,
        max_context: int,
    ) -> None:
        if num_pages < 2:
            raise ValueError(f"num_pages must be at least 2, got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_layers = num_layers
        self.device = torch.device(device)
        shape = (num_pages * page_size, num_kv_heads, head_dim)
        self.k_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.req_to_token = torch.zeros((max_reqs, max_context), dtype=torch.int32, device=device)
        self._free_pages: list[int] = list(range(num_pages - 1, 0, -1))  # pop() gives low pages
        self._free_rows: list[int] = list(range(max_reqs - 1, -1, -1))

    # -- pages -----------------------------------------------------------------------------
    @property
    def capacity_pages(self) -> int:
        return self.num_pages - 1

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
        k = self.k_buffers[0]
        return 2 * self.num_layers * k.shape[1] * k.shape[2] * k.element_size()
