"""The GrammarMatcher interface over a peer engine's matcher (DESIGN.md §5).

`PeerMatcher` holds what our own matcher guarantees and the peers do not all give: `accept`
returns False and changes nothing for a token the grammar refuses; an EOS token is accepted
wherever the text is complete (the peer never sees it: llguidance refuses EOS once nothing else
may follow) and ends the matcher (no token allowed after it); `rollback` refuses to undo more
than was accepted; `num_accepted` counts; and a matcher that failed once (a peer's own resource
limit, or one call past `step_timeout`) raises the same `GrammarBudgetExceeded` on every later
call but `rollback`, so its request fails and nothing else. The peers cannot be interrupted
inside a call: `step_timeout` is checked when the call returns.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from .budget import GrammarBudgetExceeded

_T = TypeVar("_T")


@dataclass(frozen=True)
class GrammarOptions:
    """What a peer grammar's matchers need besides the peer's own objects."""

    kind: str
    source: str  # the cache key text
    words: int  # int32 words in a mask row: ceil(model vocab / 32)
    eos_ids: frozenset[int]
    step_timeout: float


class PeerGrammar(ABC):
    """A peer's compiled grammar: immutable, shared by the matchers made from it."""

    def __init__(self, options: GrammarOptions) -> None:
        self.options = options
        self.kind = options.kind
        self.source = options.source

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Estimated bytes the peer holds for this grammar."""

    @abstractmethod
    def matcher(self) -> PeerMatcher:
        """A fresh matcher at the start of the grammar."""

    def prepare(self) -> None:  # noqa: B027 - the same for every peer, none overrides it
        """Nothing: a peer computes each matcher's masks itself, none is shared to compute now."""


class PeerMatcher(ABC):
    """One request's cursor over a peer's matcher; subclasses wrap the peer's calls."""

    backend: ClassVar[str]

    def __init__(self, grammar: PeerGrammar) -> None:
        self._words = grammar.options.words
        self._eos = grammar.options.eos_ids
        self._step_timeout = grammar.options.step_timeout
        self._accepted = 0
        self._ended = False  # an EOS was accepted (the peer's matcher never saw it)
        self.failure: GrammarBudgetExceeded | None = None

    @property
    def num_accepted(self) -> int:
        return self._accepted

    def fill_mask(self, bitmask_row: torch.Tensor) -> None:
        """Write the allowed next tokens into an int32 row of ceil(vocab/32) words."""
        if bitmask_row.dtype != torch.int32 or bitmask_row.shape[-1] != self._words:
            raise ValueError(
                f"bitmask row must be int32 with {self._words} words, got {bitmask_row.dtype} "
                f"{tuple(bitmask_row.shape)}"
            )
        if self._ended:
            bitmask_row.zero_()
        elif bitmask_row.is_cpu and bitmask_row.is_contiguous():
            self._guarded(self._fill, bitmask_row)
        else:
            row = torch.empty(self._words, dtype=torch.int32)  # the peers write host memory
            self._guarded(self._fill, row)
            bitmask_row.copy_(row)

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) when the grammar does not allow it."""
        if self._ended:
            return False
        if token_id in self._eos:
            ok = self._ended = self._guarded(self._can_end)
        else:
            ok = self._guarded(self._accept, token_id)
        self._accepted += ok
        return ok

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens."""
        if n < 0 or n > self._accepted:
            raise ValueError(f"cannot roll back {n} tokens: {self._accepted} accepted")
        self._accepted -= n
        if n and self._ended:
            self._ended = False
            n -= 1
        if n:
            self._rollback(n)

    def forced_text(self) -> str:
        """Text every valid continuation starts with (complete UTF-8 characters only)."""
        return "" if self._ended else self._guarded(self._forced_text)

    def is_terminated(self) -> bool:
        """True after EOS was accepted, or when the text is complete and nothing can follow."""
        return self._ended or self._guarded(self._is_terminated)

    def _guarded(self, call: Callable[..., _T], *args: Any) -> _T:
        if self.failure is not None:
            raise self.failure.with_traceback(None)
        start = time.perf_counter()
        try:
            out = call(*args)
        except GrammarBudgetExceeded as exc:
            self.failure = exc
            raise
        took = time.perf_counter() - start
        if took > self._step_timeout:
            self.failure = GrammarBudgetExceeded(
                "step_timeout",
                f"one {self.backend} call took {took:.2f} s, more than {self._step_timeout:g} s",
            )
            raise self.failure
        return out

    @abstractmethod
    def _fill(self, row: torch.Tensor) -> None:
        """Write the mask into `row`: contiguous int32 host memory of the right length."""

    @abstractmethod
    def _accept(self, token_id: int) -> bool:
        """Consume a (non-EOS) token if the grammar allows it; False, and no change, otherwise."""

    @abstractmethod
    def _can_end(self) -> bool:
        """Whether the text so far is complete (an EOS may come now)."""

    @abstractmethod
    def _rollback(self, n: int) -> None: ...

    @abstractmethod
    def _forced_text(self) -> str: ...

    @abstractmethod
    def _is_terminated(self) -> bool:
        """Whether the text is complete and nothing but an EOS may follow."""
