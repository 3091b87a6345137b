"""What a speculative proposer does: guess the next tokens of decoding requests.

The Speculator asks for up to k tokens per request (k adapted to its acceptance), cuts them
where a grammar stops accepting, has the target verify them, then reports how many were
accepted so a stateful proposer (a draft model with its own KV) can roll back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from radixflow.runtime.request import Req


class Proposer(ABC):
    """A source of draft tokens; the drafts of request i continue req.fill_ids(0, fill_len)."""

    # Longest pause, in steps, of a request whose drafts keep failing. 0: never pause, right
    # for drafts that cost only a wider verify (n-gram: pausing lost more copied runs than
    # it saved). A proposer that runs a model backs off further.
    max_pause_steps: int = 0

    @abstractmethod
    def propose(self, reqs: list[Req], ks: list[int]) -> list[list[int]]:
        """At most ks[i] draft tokens for each of `reqs` (possibly none)."""

    # The two hooks below do nothing by default: a proposer without state of its own (n-gram
    # lookup keeps its index on the request) has nothing to roll back or free.
    def accepted(self, req: Req, num_accepted: int) -> None:  # noqa: B027
        """After verification: the first `num_accepted` of req.draft_ids were accepted."""

    def release(self, req: Req) -> None:  # noqa: B027
        """The request finished or was aborted: drop whatever the proposer holds for it."""
