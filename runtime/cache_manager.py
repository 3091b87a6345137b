"""The KV/cache manager: the one writer of the pool's pages and rows, the radix tree, pins, and
each request's KVState.

A running request's KV (page_size 4; K/V written for its first 11 tokens):

    req.kv.pages              p7            p2            p9             p4
    req_to_token[row]   | t0 t1 t2 t3 | t4 t5 t6 t7 | t8 t9 t10 -- | -- -- -- -- |
                        └───── tree_len = 8 ──────┘            ▲
                          the tree's: shared, locked      length = 11
                          through last_node               t8..t10 and p4 (grown for
                                                          the next tokens): its own

    attach    match the request's prefix in the tree, lock it, take a row (admission)
    grow      pages and req_to_token entries for the tokens a step feeds; evicts unlocked
              prefixes when the pool is short
    commit    a forward wrote the fed tokens' K/V; a prompt chunk then goes to the tree and the
              request reads the tree's copy (so tree_len grows, and duplicate pages are freed)
    rollback  KVState.rollback: forget K/V past a length (rejected drafts, jump-forward's
              re-tokenized tail); the pages stay the request's, rewritten by later tokens
    release   the request's KV goes to the tree; what the tree does not take is freed

Pins lock a prefix a program will reuse until it is unpinned (never evicted meanwhile); they
hold at most MAX_PINNED_FRACTION of the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixflow.runtime.kv_pool import KVPool
from radixflow.runtime.radix_cache import MatchResult, RadixCache, TreeNode
from radixflow.runtime.request import KVState, Req

# Pins beyond this share of the pool would leave running requests too little room.
MAX_PINNED_FRACTION = 0.5


@dataclass
class Pin:
    """A prefix locked in the tree for a program."""

    node: TreeNode
    tokens: int


class CacheManager:
    """Owns the paged KV pool, the radix tree over it and where each request's KV lives."""

    def __init__(self, pool: KVPool, *, disable: bool = False) -> None:
        self.pool = pool
        self.page_size = pool.page_size
        self.cache = RadixCache(pool.free, page_size=pool.page_size, disable=disable)
        self.pins: dict[str, Pin] = {}
        self.pinned_tokens = 0

    @property
    def disabled(self) -> bool:
        """True when prefix reuse is off: the tree caches nothing and every match is empty."""
        return self.cache.disable

    # -- admission -----------------------------------------------------------------------------
    def match(self, ids: list[int]) -> MatchResult:
        """The longest cached prefix of `ids`, not locked."""
        return self.cache.match_prefix(ids)

    def has_free_row(self) -> bool:
        return self.pool.rows_available() > 0

    def attach(self, req: Req, match: MatchResult, reserve_pages: int) -> bool:
        """Give a waiting request its cached prefix (locked) and a row of req_to_token when
        pages for the rest of its tokens, plus `reserve_pages`, are free or evictable; False,
        with nothing taken, when they are not. Needs a free row (see has_free_row)."""
        prefix = len(match.slots)
        # Locked first: the prefix is then not counted as evictable, nor as pages to allocate.
        self.cache.lock(match.last_node)
        need = self._pages_for(req.fill_len) - prefix // self.page_size + reserve_pages
        if need > self.pool.available() + self.cache.evictable_size() // self.page_size:
            self.cache.unlock(match.last_node)
            return False
        row = self.pool.alloc_row()
        assert row is not None, "attach() without a free row"
        req.kv = KVState(
            row=row,
            pages=(match.slots[:: self.page_size] // self.page_size).tolist(),
            length=prefix,
            tree_len=prefix,
            last_node=match.last_node,
        )
        self.pool.req_to_token[row, :prefix] = match.slots.to(torch.int32)
        if req.retractions == 0:  # a retracted request keeps what its first admission hit
            req.cached_tokens = min(prefix, len(req.prompt_ids))
        return True

    # -- running -------------------------------------------------------------------------------
    def free_covers(self, req: Req, n: int) -> bool:
        """Whether free pages alone, without evicting, hold the request's next n tokens."""
        return self._pages_needed(req.kv, n) <= self.pool.available()

    def grow(self, req: Req, n: int) -> torch.Tensor | None:
        """KV slots for the request's next n tokens, also written to its req_to_token row,
        evicting unlocked prefixes when the pool is short; None (nothing taken) if pages lack."""
        kv = req.kv
        assert kv.row is not None, "grow() of a request without KV"
        new_pages = self._alloc_pages(self._pages_needed(kv, n))
        if new_pages is None:
            return None
        kv.pages.extend(new_pages)
        ps = self.page_size
        start = kv.length
        if n == 1:
            loc = torch.tensor([kv.pages[start // ps] * ps + start % ps])
        else:
            pos = torch.arange(start, start + n)
            loc = torch.tensor(kv.pages)[pos // ps] * ps + pos % ps
        self.pool.req_to_token[kv.row, start : start + n] = loc.to(torch.int32)
        return loc

    def commit(self, req: Req, n: int) -> None:
        """A forward wrote K/V for the n tokens the request fed. A prompt chunk is handed to the
        tree; longer extends past the prompt (drafts, jump-forward) wait for release."""
        kv = req.kv
        kv.length += n
        if n > 1 and kv.length - n < len(req.prompt_ids):
            self._cache_prefix(req)

    def release(self, req: Req) -> None:
        """Give the request's KV to the tree and its row back; its own pages the tree does not
        take (tokens cached meanwhile by others, the partial last page, pages past its length)
        are freed."""
        kv = req.kv
        if kv.row is None:
            return
        ps = self.page_size
        present = self.cache.insert(
            req.fill_ids(0, kv.length), self.pool.req_to_token[kv.row, : kv.length].long()
        )
        aligned = kv.length // ps * ps
        self.pool.free_pages(
            kv.pages[kv.tree_len // ps : present // ps] + kv.pages[aligned // ps :]
        )
        assert kv.last_node is not None
        self.cache.unlock(kv.last_node)
        self.pool.free_row(kv.row)
        req.kv = KVState()

    # -- pinned prefixes -------------------------------------------------------------------------
    def pin(self, pin_id: str, ids: list[int]) -> int:
        """Lock the cached part of `ids` in the tree until unpin; returns the tokens pinned
        (0 with the cache off, or when pins would hold more than MAX_PINNED_FRACTION of the
        pool: the prefix then stays cached as an ordinary, evictable entry)."""
        if self.disabled or pin_id in self.pins:
            return 0
        match = self.cache.match_prefix(ids)
        n = len(match.slots)
        if n == 0 or self.pinned_tokens + n > self.pool.capacity_tokens * MAX_PINNED_FRACTION:
            return 0
        self.cache.lock(match.last_node)
        self.pins[pin_id] = Pin(match.last_node, n)
        self.pinned_tokens += n
        return n

    def unpin(self, pin_id: str) -> None:
        """Release a pin (unknown ids are ignored: a flush already released it)."""
        pin = self.pins.pop(pin_id, None)
        if pin is not None:
            self.cache.unlock(pin.node)
            self.pinned_tokens -= pin.tokens

    def flush(self) -> None:
        """Drop every pin and empty the tree; raises RuntimeError while a request holds KV."""
        for pin_id in list(self.pins):
            self.unpin(pin_id)
        self.cache.reset()

    # -- pages ---------------------------------------------------------------------------------
    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def _pages_needed(self, kv: KVState, n: int) -> int:
        # A rollback leaves pages past kv.length: they are reused for the new tokens.
        return max(0, self._pages_for(kv.length + n) - len(kv.pages))

    def _alloc_pages(self, n: int) -> list[int] | None:
        """Free pages, evicting cached prefixes first when the pool is short."""
        short = n - self.pool.available()
        if short > 0:
            self.cache.evict(short * self.page_size)
        return self.pool.alloc_pages(n)

    def _cache_prefix(self, req: Req) -> None:
        """Insert the request's page-aligned computed prefix into the tree and switch it to the
        tree's copy: its pages duplicating tokens cached meanwhile are freed."""
        kv = req.kv
        ps = self.page_size
        aligned = kv.length // ps * ps
        if self.disabled or aligned <= kv.tree_len:
            return
        assert kv.row is not None and kv.last_node is not None
        ids = req.fill_ids(0, aligned)
        present = self.cache.insert(ids, self.pool.req_to_token[kv.row, :aligned].long())
        match = self.cache.match_prefix(ids)
        self.pool.free_pages(kv.pages[kv.tree_len // ps : present // ps])
        kv.pages[: aligned // ps] = (match.slots[::ps] // ps).tolist()
        self.pool.req_to_token[kv.row, :aligned] = match.slots.to(torch.int32)
        self.cache.lock(match.last_node)
        self.cache.unlock(kv.last_node)
        kv.last_node = match.last_node
        kv.tree_len = aligned
