"""Continuous batching with RadixAttention prefix reuse: which requests run, and how much.

Every step is one forward over a mix of rows: each running request feeds the tokens it still
has to (1 while decoding, a chunk of its prompt while prefilling), and waiting requests are
admitted, in the policy's order, while the prefill budget, request rows and KV pages allow.

The scheduler decides; the CacheManager (cache_manager.py) does everything about KV: prefix
matches and locks, pages, req_to_token rows, the tree, pins. When pages run out the manager
evicts least-recently-used unlocked prefixes first; only then does the scheduler retract the
newest running requests to the front of the queue, keeping their output.

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

from radixflow.runtime.cache_manager import CacheManager
from radixflow.runtime.radix_cache import MatchResult, TreeNode
from radixflow.runtime.request import Req

# Past this queue length, prefix matching for every waiting request costs more than it saves.
LPM_MAX_QUEUE = 128
# Waiting requests sharing this many uncached tokens with one admitted in the same round wait
# for it to warm the cache instead of computing the same prefix twice.
IN_BATCH_PREFIX_THRESHOLD = 32
# Requests admitted while a waiting one does not fit before it blocks admission (see above).
MAX_OVERTAKES = 16


@dataclass
class ScheduledStep:
    """The rows of one forward: request i feeds `extend_lens[i]` tokens from its kv.length."""

    reqs: list[Req]
    extend_lens: list[int]
    out_cache_loc: torch.Tensor  # [sum(extend_lens)] int64


@dataclass
class SchedulerLimits:
    max_running_requests: int
    chunked_prefill_size: int  # -1: prompts are never split
    max_prefill_tokens: int
    policy: str = "lpm"  # lpm | dfs-weight | fcfs


class Scheduler:
    """Queues and policy over a CacheManager; `schedule()` picks each step's rows."""

    def __init__(self, kv: CacheManager, limits: SchedulerLimits) -> None:
        self.kv = kv
        self.limits = limits
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.num_retractions = 0
        self.failed: list[Req] = []  # requests the pool can never hold; the engine reports them
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
        """Empty the tree, pinned prefixes included (only while no request is queued)."""
        if self.running or self.waiting:
            raise RuntimeError("cannot flush the cache while requests are running or waiting")
        self.kv.flush()

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
            if req.feedable == 0:  # waits for its grammar
                continue
            if req.remaining == 1:
                n = self._decode_len(req)
            else:
                n = self._chunk(req.feedable, budget, first=budget == self._prefill_budget())
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
                or not self.kv.has_free_row()
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
            loc = self.kv.grow(req, n)
            assert loc is not None  # attach checked the pages
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
        if n > 1 and not self.kv.free_covers(req, n):
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
        if policy == "fcfs" or self.kv.disabled or len(self.waiting) > LPM_MAX_QUEUE:
            return list(self.waiting)
        matches = {id(r): self.kv.match(self._matchable_ids(r)) for r in self.waiting}
        if policy == "lpm":
            return sorted(self.waiting, key=lambda r: -len(matches[id(r)].slots))
        return self._dfs_weight_order(matches)

    def _dfs_weight_order(self, matches: dict[int, MatchResult]) -> list[Req]:
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
        stack = [self.kv.cache.root]
        while stack:
            node = stack.pop()
            order.extend(at_node.get(id(node), []))
            children = [c for c in node.children.values() if id(c) in weight]
            stack.extend(sorted(children, key=lambda c: weight[id(c)]))
        return order

    def _shares_uncached_prefix(self, req: Req, admitted: list[Req]) -> bool:
        if self.kv.disabled or not admitted:
            return False
        cached = len(self.kv.match(self._matchable_ids(req)).slots)
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
        """Move a request to running on its cached prefix; returns the chunk size (0 when the
        prefill budget is spent), None (it stays waiting) when the pages for it lack now."""
        match = self.kv.match(self._matchable_ids(req))
        n = self._chunk(req.fill_len - len(match.slots), budget, first)
        if n == 0:
            return 0
        # A page of headroom per running request, so that admitting does not force a retraction.
        if not self.kv.attach(req, match, reserve_pages=len(self.running)):
            return None
        self.waiting.remove(req)
        self._overtakes.pop(id(req), None)
        self.running.append(req)
        return n

    def _fail(self, req: Req, tokens: int) -> None:
        """Finish a request with an abort, freeing its KV; the engine reports `failed`."""
        req.finish_reason = {
            "type": "abort",
            "message": f"request needs {tokens} KV tokens; the pool holds "
            f"{self.kv.pool.capacity_tokens}, {self.kv.pinned_tokens} of them in pinned prefixes",
        }
        self.remove(req)
        self.failed.append(req)

    def _grow_or_retract(self, req: Req, n: int) -> torch.Tensor | None:
        """CacheManager.grow, retracting newer running requests until pages suffice.

        Running requests are scheduled oldest first, so the newer ones are not in this step
        yet. When the request is itself the newest it is retracted; when it is alone and still
        does not fit (only pinned prefixes can crowd it: the engine stops requests at the pool's
        capacity), it fails.
        """
        while True:
            loc = self.kv.grow(req, n)
            if loc is not None:
                return loc
            if self.running[-1] is not req:
                self.retract(self.running[-1])
            elif len(self.running) > 1:
                self.retract(req)
                return None
            else:
                self._fail(req, req.kv.length + n)
                return None

    def retract(self, req: Req) -> None:
        """Requeue a running request at the front; its KV goes to the tree, its output is kept."""
        self.running.remove(req)
        self._release(req)
        req.retractions += 1
        self.num_retractions += 1
        self.waiting.insert(0, req)

    def _release(self, req: Req) -> None:
        req.draft_ids = []
        req.deferred_logits = None  # a retracted request prefills (and computes them) again
        self.kv.release(req)
