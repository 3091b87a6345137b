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

Admission never lets one request stall the queue. A waiting request fits when pages for all its
tokens past its cached prefix (locked for it: not evictable, and not needed again) are free or
evictable, with a page of headroom per running request, even when only a chunk runs now. One
that does not fit is skipped and the requests behind it are still admitted; each one admitted in
a round that skipped it overtakes it. After MAX_OVERTAKES it is overdue: overdue requests are
tried first, in queue order, and while one does not fit nothing else is admitted, so the running
requests drain until it does. With nothing running only pinned prefixes can keep a request out,
so it fails (an abort) instead of waiting for an unpin. The engine refuses prompts longer than
the pool and stops requests at its capacity, so a request running alone always has room to grow
unless pins crowd it; then it fails the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixflow.runtime.kv_pool import KVPool
from radixflow.runtime.radix_cache import MatchResult, RadixCache, TreeNode
from radixflow.runtime.request import Req

# Past this queue length, prefix matching for every waiting request costs more than it saves.
LPM_MAX_QUEUE = 128
# Waiting requests sharing this many uncached tokens with one admitted in the same round wait
# for it to warm the cache instead of computing the same prefix twice.
IN_BATCH_PREFIX_THRESHOLD = 32
# Pins beyond this share of the pool would leave running requests too little room.
MAX_PINNED_FRACTION = 0.5
# Requests admitted while a waiting one does not fit before it blocks admission (see above).
MAX_OVERTAKES = 16


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
        self._overtakes: dict[int, int] = {}  # id(waiting req) -> requests admitted past it

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
            self._overtakes.pop(id(req), None)

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
        budget = self.pool.capacity_tokens * MAX_PINNED_FRACTION
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
        rows: list[tuple[Req, int, torch.Tensor]] = []
        budget = self._schedule_running(rows)
        self._schedule_waiting(rows, budget)
        if not rows:
            return None
        reqs, lens, slots = zip(*rows, strict=True)
        return ScheduledStep(list(reqs), list(lens), torch.cat(slots))

    def _schedule_running(self, rows: list[tuple[Req, int, torch.Tensor]]) -> int:
        """Add each running request's next tokens (oldest first); returns the budget left."""
        budget = self._prefill_budget()
        for req in list(self.running):
            if req not in self.running:  # retracted while making room for an earlier one
                continue
            if req.remaining == 1:
                n = self._decode_len(req)
            else:
                n = self._chunk(req.remaining, budget, first=budget == self._prefill_budget())
            if n == 0:
                continue
            loc = self._grow_or_retract(req, n)
            if loc is None:
                continue
            rows.append((req, n, loc))
            if n > 1:
                budget -= n
        return budget

    def _schedule_waiting(self, rows: list[tuple[Req, int, torch.Tensor]], budget: int) -> None:
        """Admit waiting requests while budget, rows and pages allow (see the module docstring)."""
        admitted: list[Req] = []
        refused: list[Req] = []
        for req in self._admission_order():
            if (
                budget <= 0
                or len(self.running) >= self.limits.max_running_requests
                or self.pool.rows_available() == 0
            ):
                break
            if self._shares_uncached_prefix(req, admitted):
                continue
            n = self._admit(req, budget, first=budget == self._prefill_budget())
            if n == 0:  # a whole prompt (no chunking) waits for a step with budget for it
                break
            if n is None:
                if not self.running:
                    self._fail(req, req.fill_len)
                    continue
                if self._overdue(req):
                    break
                refused.append(req)
                continue
            loc = self._grow(req, n)
            assert loc is not None  # _admit checked the pages
            admitted.append(req)
            rows.append((req, n, loc))
            budget -= n
        for req in refused:
            self._overtakes[id(req)] = self._overtakes.get(id(req), 0) + len(admitted)

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

    def _chunk(self, remaining: int, budget: int, first: bool) -> int:
        """How many of a request's remaining tokens fit this step's prefill budget."""
        if self.limits.chunked_prefill_size > 0:
            return min(remaining, budget)
        # Without chunking a prompt goes whole; the first one of a step may exceed the budget.
        return remaining if (remaining <= budget or first) else 0

    def _overdue(self, req: Req) -> bool:
        return self._overtakes.get(id(req), 0) >= MAX_OVERTAKES

    def _admission_order(self) -> list[Req]:
        """Overdue requests in queue order, then the rest in the policy's order."""
        overdue = [r for r in self.waiting if self._overdue(r)]
        if not overdue:
            return self._ordered_waiting()
        return overdue + [r for r in self._ordered_waiting() if not self._overdue(r)]

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
        """Attach the cached prefix and a row; returns the chunk size (0 when the prefill budget
        is spent), or None (nothing taken) when the pages for it lack now."""
        match = self.cache.match_prefix(self._matchable_ids(req))
        prefix = len(match.slots)
        n = self._chunk(req.fill_len - prefix, budget, first)
        if n == 0:
            return 0
        # Locked first: the prefix is then not counted as evictable, nor as pages to allocate.
        self.cache.lock(match.last_node)
        if not self._fits(prefix, req.fill_len):
            self.cache.unlock(match.last_node)
            return None
        self._attach(req, match)
        return n

    def _fits(self, prefix: int, end: int) -> bool:
        """Whether pages for tokens [prefix, end) are free or evictable, keeping one page of
        headroom per running request so that admitting does not force a retraction."""
        need = self._pages_for(end) - prefix // self.pool.page_size + len(self.running)
        return need <= self.pool.available() + self.cache.evictable_size() // self.pool.page_size

    def _attach(self, req: Req, match: MatchResult) -> None:
        """Move a request to running on its locked prefix, with a row of req_to_token."""
        self.waiting.remove(req)
        self._overtakes.pop(id(req), None)
        prefix = len(match.slots)
        req.last_node = match.last_node
        req.kv_len = req.cache_len = prefix
        req.pages = (match.slots[:: self.pool.page_size] // self.pool.page_size).tolist()
        req.row = self.pool.alloc_row()
        self.pool.req_to_token[req.row, :prefix] = match.slots.to(torch.int32)
        if req.retractions == 0:
            req.cached_tokens = min(prefix, len(req.prompt_ids))
        self.running.append(req)

    def _fail(self, req: Req, tokens: int) -> None:
        """Finish a request with an abort, freeing its KV; the engine reports `failed`."""
        req.finish_reason = {
            "type": "abort",
            "message": f"request needs {tokens} KV tokens; the pool holds "
            f"{self.pool.capacity_tokens}, {self.pinned_tokens} of them in pinned prefixes",
        }
        self.remove(req)
        self.failed.append(req)

    # -- KV pages ------------------------------------------------------------------------------
    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.pool.page_size)

    def _pages_needed(self, req: Req, n: int) -> int:
        # Jump-forward may roll kv_len back, leaving pages that are reused for the new tokens.
        return max(0, self._pages_for(req.kv_len + n) - len(req.pages))

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
        does not fit (only pinned prefixes can crowd it: the engine stops requests at the pool's
        capacity), it fails.
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
                self._fail(req, req.kv_len + n)
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
