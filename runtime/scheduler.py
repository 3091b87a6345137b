"""Continuous batching: which requests run in the next forward, and their KV pages.

Every step is one forward over a mix of rows: each running request contributes the tokens it
still has to feed (1 while decoding, a chunk of its prompt while prefilling), and waiting
requests are admitted while the prefill budget, request slots and KV pages allow. When pages
run out during decoding, the newest running requests are retracted to the front of the
waiting queue (their KV freed, their output kept) and resume later by re-prefilling.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from radixflow.runtime.kv_pool import KVPool
from radixflow.runtime.request import Req


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
    context_length: int


class Scheduler:
    def __init__(self, pool: KVPool, limits: SchedulerLimits) -> None:
        self.pool = pool
        self.limits = limits
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.num_retractions = 0
        self.failed: list[Req] = []  # requests the pool can never hold; the engine reports them

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

    # -- scheduling ----------------------------------------------------------------------------
    def schedule(self) -> ScheduledStep | None:
        reqs: list[Req] = []
        lens: list[int] = []
        slots: list[torch.Tensor] = []
        budget = self._prefill_budget()
        for req in list(self.running):
            if req not in self.running:  # retracted while making room for an earlier one
                continue
            n = req.remaining if req.remaining == 1 else self._chunk(req, budget, first=not reqs)
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
        while self.waiting and budget > 0 and len(self.running) < self.limits.max_running_requests:
            req = self.waiting[0]
            n = self._chunk(req, budget, first=not any(n > 1 for n in lens))
            if n == 0 or not self._can_admit(req, n):
                break
            self.waiting.popleft()
            req.row = self.pool.alloc_row()
            loc = self._grow(req, n)
            assert loc is not None  # _can_admit checked the pages
            self.running.append(req)
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

    def _chunk(self, req: Req, budget: int, first: bool) -> int:
        """How many of the request's remaining tokens fit this step's prefill budget."""
        if self.limits.chunked_prefill_size > 0:
            return min(req.remaining, budget)
        # Without chunking a prompt goes whole; the first one of a step may exceed the budget.
        return req.remaining if (req.remaining <= budget or first) else 0

    def _can_admit(self, req: Req, n: int) -> bool:
        if self.pool.rows_available() == 0:
            return False
        # Keep one page of headroom per running request so admitting does not force retraction.
        need = self._pages_needed(req, n) + len(self.running)
        return self.pool.available() >= need

    # -- KV pages ------------------------------------------------------------------------------
    def _pages_needed(self, req: Req, n: int) -> int:
        ps = self.pool.page_size
        return -(-(req.kv_len + n) // ps) - len(req.pages)

    def _grow(self, req: Req, n: int) -> torch.Tensor | None:
        """Give the request KV slots for its next n tokens; None (nothing taken) if pages lack."""
        new_pages = self.pool.alloc_pages(self._pages_needed(req, n))
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
        """Free a running request's KV and requeue it at the front; its output is kept."""
        self.running.remove(req)
        self._release(req)
        req.retractions += 1
        self.num_retractions += 1
        self.waiting.appendleft(req)

    def _release(self, req: Req) -> None:
        self.pool.free_pages(req.pages)
        req.pages = []
        req.kv_len = 0
        if req.row is not None:
            self.pool.free_row(req.row)
            req.row = None
