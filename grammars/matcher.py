"""CompiledGrammar (immutable, shared) and GrammarMatcher (one request's cursor over it)."""

from __future__ import annotations

import codecs
from collections import OrderedDict

import numpy as np
import torch

from .automaton import ByteAutomaton
from .masks import WalkTable, compute_mask
from .tokenizer_index import TokenizerIndex

_TERMINATED = -2
_MAX_FORCED_BYTES = 1024


class CompiledGrammar:
    """A grammar bound to one tokenizer; caches masks and forced text per automaton state."""

    def __init__(
        self,
        index: TokenizerIndex,
        automaton: ByteAutomaton,
        kind: str,
        source: str,
        mask_cache_size: int = 4096,
    ):
        self.index = index
        self.automaton = automaton
        self.kind = kind
        self.source = source
        self._walk = WalkTable(automaton)
        self.empty_mask = np.zeros(index.num_words, dtype=np.int32)  # no token allowed
        self._masks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._forced: dict[int, bytes] = {}
        self._mask_cache_size = mask_cache_size

    def matcher(self) -> GrammarMatcher:
        """A fresh matcher at the start of the grammar."""
        return GrammarMatcher(self)

    def mask(self, state: int) -> np.ndarray:
        """Packed int32 mask of the tokens allowed in `state`."""
        with self.automaton.lock:
            got = self._masks.get(state)
            if got is None:
                got = compute_mask(self.index, self._walk, state)
                self._masks[state] = got
                if len(self._masks) > self._mask_cache_size:
                    self._masks.popitem(last=False)
            return got

    def step(self, state: int, token_id: int) -> int:
        """State after `token_id`'s bytes, or -1 when the token is not allowed."""
        data = self.index.token_bytes[token_id] if 0 <= token_id < self.index.vocab_size else None
        if data is None:
            return -1
        with self.automaton.lock:
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
                out = bytearray()
                s = state
                while len(out) < _MAX_FORCED_BYTES and not self.automaton.is_accepting(s):
                    live = np.flatnonzero(self.automaton.row(s) >= 0)
                    if live.size != 1:
                        break
                    out.append(int(live[0]))
                    s = int(self.automaton.row(s)[live[0]])
                got = self._forced[state] = bytes(out)
            return got

    def can_continue(self, state: int) -> bool:
        with self.automaton.lock:
            return bool((self.automaton.row(state) >= 0).any())


class GrammarMatcher:
    """Per-request cursor: masks, token acceptance, rollback and jump-forward text."""

    def __init__(self, grammar: CompiledGrammar):
        self.grammar = grammar
        self._states: list[int] = [grammar.automaton.initial]

    @property
    def vocab_size(self) -> int:
        return self.grammar.index.vocab_size

    def next_token_mask(self) -> np.ndarray:
        """The allowed next tokens as a packed int32[ceil(vocab/32)] row.

        The array is shared with the grammar's mask cache: copy it before changing it.
        """
        state = self._states[-1]
        if state == _TERMINATED:
            return self.grammar.empty_mask
        return self.grammar.mask(state)

    def fill_mask(self, bitmask_row: torch.Tensor) -> None:
        """Write the allowed next tokens into an int32 row of ceil(vocab/32) words."""
        words = self.grammar.index.num_words
        if bitmask_row.dtype != torch.int32 or bitmask_row.shape[-1] != words:
            raise ValueError(
                f"bitmask row must be int32 with {words} words, got {bitmask_row.dtype} "
                f"{tuple(bitmask_row.shape)}"
            )
        bitmask_row.copy_(torch.from_numpy(self.next_token_mask()))

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

    def forced_text(self) -> str:
        """Text every valid continuation starts with (complete UTF-8 characters only)."""
        state = self._states[-1]
        if state == _TERMINATED:
            return ""
        data = self.grammar.forced_bytes(state)
        return codecs.getincrementaldecoder("utf-8")().decode(data, final=False)

    def is_terminated(self) -> bool:
        """True after EOS was accepted, or when the text is complete and nothing can follow."""
        state = self._states[-1]
        if state == _TERMINATED:
            return True
        return self.grammar.automaton.is_accepting(state) and not self.grammar.can_continue(state)

    @property
    def num_accepted(self) -> int:
        return len(self._states) - 1
