"""Continuous batching over a paged KV pool with RadixAttention prefix reuse.

Every step is one forward over a mix of rows: each running request feeds the tokens it still
has to (1 while decoding, a chunk of its prompt while prefilling), and waiting requests are
admitted, in the policy's order, while the prefill budget, request rows and KV pages allow.

A request's KV lives in pages listed in `req.pages`; the first `req.cache_len` tokens are the
radix tree's (shared, locked through `req.last_node`), the rest are its own. Prefill chunks and
finished requests are inserted into the tree, so later requests (and the next chat turn) hit.
When pages run out the tree evicts least-recently-used unlocked prefixes first; only then are
the newest running requests retracted to the front of the queue, keeping their output.
Programs may pin prefixes they will reuse (a fork's shared text): pinned tree nodes stay locked,
so never evicted, until unpinned; pins hold at most MAX_PINNED_FRACTION of the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixflow.runtime.kv_pool import KVPool
from radixflow.runtime.radix_cache import RadixCache, TreeNode
from radixflow.runtime.request import Req

# Past this queue length, prefix matching for every waiting request costs more than it saves.
LPM_MAX_QUEUE = 128
# Waiting requests sharing this many uncached tokens with one admitted in the same round wait
# for it to warm the cache instead of computing the same prefix twice.
IN_BATCH_PREFIX_THRESHOLD = 32
# Pins beyond this share of the pool would leave running requests too little room.
MAX_PINNED_FRACTION = 0.5


@dataclass
class ScheduledStep:
    """The rows of one forward: request i feeds `extend_lens[i]` tokens starting at its kv_len."""

    reqs: list[Req]
    extend_lens: list[int]
    out_cache_loc: torch.Tensor  # [sum(extend_lens)] int64


@dataclass
class SchedulerLimits:
    max_running_requests: int
    chunked_prefill_size: int  # -1: prompts are never split
    max_prefill_tokens: int
    policy: str = "lpm"  # lpm | dfs-weight | fcfs
    disable_radix_cache: bool = False


class Scheduler:
    def __init__(self, pool: KVPool, limits: SchedulerLimits) -> None:
        self.pool = pool
        self.limits = limits
        self.cache = RadixCache(
            pool.free, page_size=pool.page_size, disable=limits.disable_radix_cache
        )
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.num_retractions = 0
        self.failed: list[Req] = []  # requests the pool can never hold; the engine reports them
        self.pins: dict[str, tuple[TreeNode, int]] = {}  # pin id -> (locked tree node, tokens)
        self.pinned_tokens = 0

    # -- queue ---------------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, req: Req) -> None:
        """Take a request out wherever it is and give back its KV (finished or aborted)."""
        if req in self.running:
            self.running.remove(req)
            self._release(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def flush_cache(self) -> None:
        """Empty the tree, pinned prefixes included."""
        if self.running or self.waiting:
            raise RuntimeError("cannot flush the cache while requests are running or waiting")
        for pin_id in list(self.pins):
            self.unpin(pin_id)
        self.cache.reset()

    # -- pinned prefixes -------------------------------------------------------------------------
    def pin(self, pin_id: str, ids: list[int]) -> int:
        """Lock the cached part of `ids` in the tree until unpin; returns the tokens pinned
        (0 with the cache off, or when pins would hold more than MAX_PINNED_FRACTION of the
        pool: the prefix then stays cached as an ordinary, evictable entry)."""
        if self.cache.disable or pin_id in self.pins:
            return 0
        match = self.cache.match_prefix(ids)
        n = len(match.slots)
        budget = self.pool.capacity_pages * self.pool.page_size * MAX_PINNED_FRACTION
        if n == 0 or self.pinned_tokens + n > budget:
            return 0
        self.cache.lock(match.last_node)
        self.pins[pin_id] = (match.last_node, n)
        self.pinned_tokens += n
        return n

    def unpin(self, pin_id: str) -> None:
        """Release a pin (unknown ids are ignored: a flush already released it)."""
        pinned = self.pins.pop(pin_id, None)
        if pinned is not None:
            self.cache.unlock(pinned[0])
            self.pinned_tokens -= pinned[1]

    # -- scheduling ----------------------------------------------------------------------------
    def schedule(self) -> ScheduledStep | None:
        reqs: list[Req] = []
        lens: list[int] = []
        slots: list[torch.Tensor] = []
        budget = self._prefill_budget()
        for req in list(self.running):
            if req not in self.running:  # retracted while making room for an earlier one
                continue
            if req.remaining == 1:
                n = self._decode_len(req)
            else:
                n = self._chunk(req, budget, first=budget == self._prefill_budget())
            if n == 0:
                continue
            loc = self._grow_or_retract(req, n)
            if loc is None:
                continue
            reqs.append(req)
            lens.append(n)
            slots.append(loc)
            if n > 1:
                budget -= n
        admitted: list[Req] = []
        for req in self._ordered_waiting():
            if budget <= 0 or len(self.running) >= self.limits.max_running_requests:
                break
            if self._shares_uncached_prefix(req, admitted):
                continue
            n = self._admit(req, budget, first=budget == self._prefill_budget())
            if n is None:
                break
            loc = self._grow(req, n)
            assert loc is not None  # _admit checked the pages
            admitted.append(req)
            reqs.append(req)
            lens.append(n)
            slots.append(loc)
            budget -= n
        if not reqs:
            return None
        return ScheduledStep(reqs, lens, torch.cat(slots))

    def _prefill_budget(self) -> int:
        size = self.limits.chunked_prefill_size
        return size if size > 0 else self.limits.max_prefill_tokens

    def _decode_len(self, req: Req) -> int:
        """1, or 1 + its drafts to verify; drafts are dropped when they would need more pages
        than are free (speculation never evicts the cache or retracts a request)."""
        n = 1 + len(req.draft_ids)
        if n > 1 and self._pages_needed(req, n) > self.pool.available():
            req.draft_ids = []
            return 1
        return n

    def _chunk(self, req: Req, budget: int, first: bool) -> int:
        """How many of the request's remaining tokens fit this step's prefill budget."""
        if self.limits.chunked_prefill_size > 0:
            return min(req.remaining, budget)
        # Without chunking a prompt goes whole; the first one of a step may exceed the budget.
        return req.remaining if (req.remaining <= budget or first) else 0

    def _ordered_waiting(self) -> list[Req]:
        policy = self.limits.policy
        if policy == "fcfs" or self.cache.disable or len(self.waiting) > LPM_MAX_QUEUE:
            return list(self.waiting)
        matches = {id(r): self.cache.match_prefix(self._matchable_ids(r)) for r in self.waiting}
        if policy == "lpm":
            return sorted(self.waiting, key=lambda r: -len(matches[id(r)].slots))
        return self._dfs_weight_order(matches)

    def _dfs_weight_order(self, matches: dict) -> list[Req]:
        """Visit the tree heaviest subtree first (weight = waiting requests below a node)."""
        at_node: dict[int, list[Req]] = {}
        weight: dict[int, int] = {}
        for req in self.waiting:
            node: TreeNode | None = matches[id(req)].last_node
            at_node.setdefault(id(node), []).append(req)
            while node is not None:
                weight[id(node)] = weight.get(id(node), 0) + 1
                node = node.parent
        order: list[Req] = []
        stack = [self.cache.root]
        while stack:
            node = stack.pop()
            order.extend(at_node.get(id(node), []))
            children = [c for c in node.children.values() if id(c) in weight]
            stack.extend(sorted(children, key=lambda c: weight[id(c)]))
        return order

    def _shares_uncached_prefix(self, req: Req, admitted: list[Req]) -> bool:
        if self.cache.disable or not admitted:
            return False
        cached = len(self.cache.match_prefix(self._matchable_ids(req)).slots)
        ids = req.fill_ids(0, req.fill_len)
        for other in admitted:
            theirs = other.fill_ids(0, other.fill_len)
            common = 0
            for a, b in zip(ids, theirs, strict=False):
                if a != b:
                    break
                common += 1
            if common - cached >= IN_BATCH_PREFIX_THRESHOLD:
                return True
        return False

    @staticmethod
    def _matchable_ids(req: Req) -> list[int]:
        # The last token is always fed, so its logits exist to sample from; prompt positions
        # that still need input logprobs are fed too (their logits are not in the cache).
        end = req.fill_len - 1
        if req.wants_input_logprobs and not req.input_logprobs:
            end = min(end, max(req.logprob.logprob_start_len - 1, 0))
        return req.fill_ids(0, end)

    def _admit(self, req: Req, budget: int, first: bool) -> int | None:
        """Attach the cached prefix and a row; returns the chunk size, or None if it cannot run."""
        if self.pool.rows_available() == 0:
            return None
        match = self.cache.match_prefix(self._matchable_ids(req))
        prefix = len(match.slots)
        req.kv_len = prefix
        n = self._chunk(req, budget, first)
        self.cache.lock(match.last_node)  # before counting what eviction could free
        # One page of headroom per running request so admitting does not force retraction.
        need = self._pages_needed(req, n, prefix // self.pool.page_size) + len(self.running)
        free = self.pool.available() + self.cache.evictable_size() // self.pool.page_size
        if n == 0 or need > free:
            self.cache.unlock(match.last_node)
            req.kv_len = 0
            return None
        self.waiting.remove(req)
        req.last_node = match.last_node
        req.cache_len = prefix
        req.pages = (match.slots[:: self.pool.page_size] // self.pool.page_size).tolist()
        req.row = self.pool.alloc_row()
        self.pool.req_to_token[req.row, :prefix] = match.slots.to(torch.int32)
        if req.retractions == 0:
            req.cached_tokens = min(prefix, len(req.prompt_ids))
        self.running.append(req)
        return n

    # -- KV pages ------------------------------------------------------------------------------
    def _pages_needed(self, req: Req, n: int, have: int | None = None) -> int:
        have = len(req.pages) if have is None else have
        # Jump-forward may roll kv_len back, leaving pages that are reused for the new tokens.
        return max(0, -(-(req.kv_len + n) // self.pool.page_size) - have)

    def _alloc_pages(self, n: int) -> list[int] | None:
        """Free pages, evicting cached prefixes first when the pool is short."""
        short = n - self.pool.available()
        if short > 0:
            self.cache.evict(short * self.pool.page_size)
        return self.pool.alloc_pages(n)

    def _grow(self, req: Req, n: int) -> torch.Tensor | None:
        """Give the request KV slots for its next n tokens; None (nothing taken) if pages lack."""
        new_pages = self._alloc_pages(self._pages_needed(req, n))
        if new_pages is None:
            return None
        req.pages.extend(new_pages)
        ps = self.pool.page_size
        start = req.kv_len
        if n == 1:
            loc = torch.tensor([req.pages[start // ps] * ps + start % ps])
        else:
            pos = torch.arange(start, start + n)
            loc = torch.tensor(req.pages)[pos // ps] * ps + pos % ps
        self.pool.req_to_token[req.row, start : start + n] = loc.to(torch.int32)
        return loc

    def _grow_or_retract(self, req: Req, n: int) -> torch.Tensor | None:
        """Like _grow, but retracts newer running requests until pages suffice.

        Running requests are scheduled oldest first, so the newer ones are not in this step
        yet. When the request is itself the newest it is retracted; when it is alone and still
        does not fit, it can never fit and fails.
        """
        while True:
            loc = self._grow(req, n)
            if loc is not None:
                return loc
            if self.running[-1] is not req:
                self.retract(self.running[-1])
            elif len(self.running) > 1:
                self.retract(req)
                return None
            else:
                capacity = self.pool.capacity_pages * self.pool.page_size
                req.finish_reason = {
                    "type": "abort",
                    "message": f"request needs {req.kv_len + n} KV tokens; the pool holds {capacity}",
                }
                self.remove(req)
                self.failed.append(req)
                return None

    def retract(self, req: Req) -> None:
        """Requeue a running request at the front; its KV goes to the tree, its output is kept."""
        self.running.remove(req)
        self._release(req)
        req.retractions += 1
        self.num_retractions += 1
        self.waiting.insert(0, req)

    # -- the radix tree --------------------------------------------------------------------------
    def cache_prefill_chunk(self, req: Req) -> None:
        """After a prefill chunk: hand the computed prefix to the tree and use the tree's copy."""
        ps = self.pool.page_size
        aligned = req.kv_len // ps * ps
        if self.cache.disable or aligned <= req.cache_len:
            return
        ids = req.fill_ids(0, aligned)
        present = self.cache.insert(ids, self.pool.req_to_token[req.row, :aligned].long())
        match = self.cache.match_prefix(ids)
        self.pool.free_pages(req.pages[req.cache_len // ps : present // ps])
        req.pages[: aligned // ps] = (match.slots[::ps] // ps).tolist()
        self.pool.req_to_token[req.row, :aligned] = match.slots.to(torch.int32)
        self.cache.lock(match.last_node)
        self.cache.unlock(req.last_node)
        req.last_node = match.last_node
        req.cache_len = aligned

    def _release(self, req: Req) -> None:
        """Give the request's KV to the tree (own pages it does not take are freed)."""
        req.draft_ids = []
        if req.row is None:
            return
        ps = self.pool.page_size
        kv = req.kv_len
        present = self.cache.insert(
            req.fill_ids(0, kv), self.pool.req_to_token[req.row, :kv].long()
        )
        aligned = kv // ps * ps
        self.pool.free_pages(
            req.pages[req.cache_len // ps : present // ps] + req.pages[aligned // ps :]
        )
        self.cache.unlock(req.last_node)
        self.pool.free_row(req.row)
        req.row = None
        req.pages = []
        req.kv_len = 0
        req.cache_len = 0
        req.last_node = None
