"""N-gram prompt lookup: propose what followed the latest earlier occurrence of the context's tail.

Outputs that copy their input (extraction, summaries, code edits) repeat long runs of the prompt;
matching the last n tokens (n = MAX_NGRAM down to MIN_NGRAM) against prompt + output finds where
such a run continues, at no model cost. The index maps every n-gram to the position right after
its latest occurrence and grows with the sequence, so a lookup is a few dict probes.
"""

from __future__ import annotations

from radixflow.runtime.request import Req
from radixflow.runtime.speculative.proposer import Proposer

MAX_NGRAM = 4
MIN_NGRAM = 1
# The tail of the indexed tokens compared with the sequence on every sync: jump-forward may
# rewrite the last few output tokens, and a rewritten tail means the index is rebuilt.
SYNC_CHECK = 8


class NgramIndex:
    """Latest-occurrence index over one growing token sequence."""

    def __init__(self, max_n: int = MAX_NGRAM, min_n: int = MIN_NGRAM) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n = max_n
        self.min_n = min_n
        self.tokens: list[int] = []
        # n-gram -> index of the token that followed its latest occurrence (always < len(tokens))
        self._next: dict[tuple[int, ...], int] = {}

    def sync(self, tokens: list[int]) -> None:
        """Make the index cover `tokens` (usually the indexed ones plus a few new)."""
        have = len(self.tokens)
        tail = min(have, SYNC_CHECK)
        if len(tokens) < have or tokens[have - tail : have] != self.tokens[have - tail :]:
            self.tokens, self._next, have = [], {}, 0
        self.tokens.extend(tokens[have:])
        t = self.tokens
        for i in range(max(1, have), len(t)):
            for n in range(self.min_n, min(self.max_n, i) + 1):
                self._next[tuple(t[i - n : i])] = i

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the longest matching tail; [] when none matches."""
        t = self.tokens
        for n in range(min(self.max_n, len(t)), self.min_n - 1, -1):
            start = self._next.get(tuple(t[len(t) - n :]))
            if start is not None:
                return t[start : start + k]
        return []


class NgramProposer(Proposer):
    """Prompt lookup: each request's drafts come from its own NgramIndex (kept in req.spec)."""

    def propose(self, reqs: list[Req], ks: list[int]) -> list[list[int]]:
        drafts = []
        for req, k in zip(reqs, ks, strict=True):
            if req.spec.proposer_state is None:
                req.spec.proposer_state = NgramIndex()
            index: NgramIndex = req.spec.proposer_state
            index.sync(req.fill_ids(0, req.fill_len))
            drafts.append(index.propose(k))
        return drafts
