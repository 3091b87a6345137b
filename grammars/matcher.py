"""CompiledGrammar (immutable, shared) and GrammarMatcher (one request's cursor over it).

Automaton work happens inside matcher calls and is held to the grammar's budget (`budget`):
a call that would exceed it raises `GrammarBudgetExceeded`, and every later call on that
matcher but `rollback` raises it again, so whatever its request does next fails it too.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import functools
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from .automaton import ByteAutomaton
from .budget import GrammarBudgetExceeded, GrammarLimits
from .masks import WalkTable, compute_mask
from .reaper import busy
from .states import DICT_ENTRY_BYTES
from .tokenizer_index import TokenizerIndex

_TERMINATED = -2
_MAX_FORCED_BYTES = 1024
_T = TypeVar("_T")


class CompiledGrammar:
    """A grammar bound to one tokenizer; caches masks (LRU, by bytes) and forced text per state."""

    def __init__(
        self,
        index: TokenizerIndex,
        automaton: ByteAutomaton,
        kind: str,
        source: str,
        limits: GrammarLimits | None = None,
        mask_cache_mb: float = 32.0,
    ):
        self.index = index
        self.automaton = automaton
        self.kind = kind
        self.source = source
        self.budget = automaton.budget
        self.budget.bind(limits or GrammarLimits())
        self._walk = WalkTable(automaton)
        self.empty_mask = np.zeros(index.num_words, dtype=np.int32)  # no token allowed
        self.empty_entry = (self.empty_mask, self.empty_mask.ctypes.data)  # and its address
        # Least recently used first. A plain dict (ordered as written) of ints to arrays stays
        # out of the cyclic collector's sight; an OrderedDict is walked by every collection.
        self._masks: dict[int, np.ndarray] = {}
        # each cached mask's address (`fill_mask` copies from it: asking numpy for it costs as
        # much as the copy)
        self._addresses: dict[int, int] = {}
        self._mask_cache_bytes = mask_cache_mb * 2**20
        self._forced: dict[int, bytes] = {}
        self._cached_bytes = 0  # of masks and forced text

    @property
    def nbytes(self) -> int:
        """Estimated bytes held: automata, walk table, masks, forced text (grows with use)."""
        return self.budget.nbytes + self._walk.nbytes + self._cached_bytes

    def containers(self) -> list:
        """The lists and dicts this grammar and its automaton alone hold (see `reaper`)."""
        return [
            self._masks,
            self._addresses,
            self._forced,
            *self._walk.containers(),
            *self.automaton.containers(),
        ]

    def matcher(self) -> GrammarMatcher:
        """A fresh matcher at the start of the grammar."""
        return GrammarMatcher(self)

    def prepare(self) -> None:
        """Compute the start state's mask now (the engine calls this on the thread that
        compiled the grammar, while it prefills the request), so that the request's first
        token does not wait for it. A budget the walk exceeds is left to the request's own
        mask call to report."""
        with contextlib.suppress(GrammarBudgetExceeded):
            self.mask(self.automaton.initial)

    def mask(self, state: int) -> np.ndarray:
        """Packed int32 mask of the tokens allowed in `state`."""
        return self.mask_entry(state)[0]

    def mask_entry(self, state: int) -> tuple[np.ndarray, int]:
        """`mask(state)` and the address of its words."""
        with self.automaton.lock:
            got = self._masks.pop(state, None)
            if got is not None:
                self._masks[state] = got
                return got, self._addresses[state]
            with self.budget:
                got = compute_mask(self.index, self._walk, state)
            self._masks[state] = got
            address = self._addresses[state] = got.ctypes.data
            self._cached_bytes += got.nbytes + 2 * DICT_ENTRY_BYTES
            while self._cached_bytes > self._mask_cache_bytes and len(self._masks) > 1:
                oldest = next(iter(self._masks))
                self._cached_bytes -= self._masks.pop(oldest).nbytes + 2 * DICT_ENTRY_BYTES
                del self._addresses[oldest]
            return got, address

    def step(self, state: int, token_id: int) -> int:
        """State after `token_id`'s bytes, or -1 when the token is not allowed."""
        data = self.index.token_bytes[token_id] if 0 <= token_id < self.index.vocab_size else None
        if data is None:
            return -1
        with self.automaton.lock, self.budget:
            for b in data:
                state = int(self.automaton.row(state)[b])
                if state < 0:
                    return -1
        return state

    def forced_bytes(self, state: int) -> bytes:
        """Bytes every continuation from `state` starts with."""
        with self.automaton.lock:
            got = self._forced.get(state)
            if got is None:
                with self.budget:
                    got = self._walk_forced(state)
                self._forced[state] = got
                self._cached_bytes += len(got) + DICT_ENTRY_BYTES
            return got

    def _walk_forced(self, state: int) -> bytes:
        """Follow `state`'s only live byte while there is exactly one and it is not accepting."""
        out = bytearray()
        while len(out) < _MAX_FORCED_BYTES and not self.automaton.is_accepting(state):
            live = np.flatnonzero(self.automaton.row(state) >= 0)
            if live.size != 1:
                break
            out.append(int(live[0]))
            state = int(self.automaton.row(state)[live[0]])
        return bytes(out)

    def can_continue(self, state: int) -> bool:
        with self.automaton.lock, self.budget:
            return int(self.automaton.row(state).max()) >= 0


def _failing_for_good(method: Callable[..., _T]) -> Callable[..., _T]:
    """A matcher call that, once the grammar's budget failed it, fails every time after."""

    @functools.wraps(method)
    def call(self: GrammarMatcher, *args) -> _T:
        if self.failure is not None:
            raise self.failure.with_traceback(None)
        try:
            return method(self, *args)
        except GrammarBudgetExceeded as exc:
            self.failure = exc
            raise

    return call


class GrammarMatcher:
    """Per-request cursor: masks, token acceptance, rollback and jump-forward text."""

    def __init__(self, grammar: CompiledGrammar):
        self.grammar = grammar
        self._states: list[int] = [grammar.automaton.initial]
        self.failure: GrammarBudgetExceeded | None = None  # why the budget stopped this matcher

    @property
    def vocab_size(self) -> int:
        return self.grammar.index.vocab_size

    def next_token_mask(self) -> np.ndarray:
        """The allowed next tokens as a packed int32[ceil(vocab/32)] row.

        The array is shared with the grammar's mask cache: copy it before changing it.
        """
        return self._mask_entry()[0]

    @_failing_for_good
    def _mask_entry(self) -> tuple[np.ndarray, int]:
        state = self._states[-1]
        if state == _TERMINATED:
            return self.grammar.empty_entry
        return self.grammar.mask_entry(state)

    def fill_mask(self, bitmask_row: torch.Tensor) -> None:
        """Write the allowed next tokens into an int32 row of ceil(vocab/32) words."""
        words = self.grammar.index.num_words
        shape = bitmask_row.shape
        if bitmask_row.dtype != torch.int32 or shape[-1] != words:
            raise ValueError(
                f"bitmask row must be int32 with {words} words, got {bitmask_row.dtype} "
                f"{tuple(shape)}"
            )
        with busy:
            mask, address = self._mask_entry()
            # A host row is written by one memmove: torch's copy costs three times as much
            # where the caches are cold, as they are after a compile or a forward pass.
            if len(shape) == 1 and bitmask_row.is_cpu and bitmask_row.is_contiguous():
                ctypes.memmove(bitmask_row.data_ptr(), address, mask.nbytes)
            else:
                bitmask_row.copy_(torch.from_numpy(mask))

    @_failing_for_good
    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) when the grammar does not allow it."""
        state = self._states[-1]
        if state == _TERMINATED:
            return False
        if token_id in self.grammar.index.eos_ids:
            if not self.grammar.automaton.is_accepting(state):
                return False
            self._states.append(_TERMINATED)
            return True
        nxt = self.grammar.step(state, token_id)
        if nxt < 0:
            return False
        self._states.append(nxt)
        return True

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens."""
        if n < 0 or n > len(self._states) - 1:
            raise ValueError(f"cannot roll back {n} tokens: {len(self._states) - 1} accepted")
        if n:
            del self._states[-n:]

    @_failing_for_good
    def forced_text(self) -> str:
        """Text every valid continuation starts with (complete UTF-8 characters only)."""
        state = self._states[-1]
        if state == _TERMINATED:
            return ""
        data = self.grammar.forced_bytes(state)
        if data and 0x80 <= data[0] < 0xC0:  # the rest of a character a token began: no text
            return ""
        return codecs.getincrementaldecoder("utf-8")().decode(data, final=False)

    @_failing_for_good
    def is_terminated(self) -> bool:
        """True after EOS was accepted, or when the text is complete and nothing can follow."""
        state = self._states[-1]
        if state == _TERMINATED:
            return True
        return self.grammar.automaton.is_accepting(state) and not self.grammar.can_continue(state)

    @property
    def num_accepted(self) -> int:
        return len(self._states) - 1
