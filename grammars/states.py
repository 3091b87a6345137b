"""Interned automaton states and their lazily computed rows, counted against a grammar's budget.

A state is a hashable set (of NFA states, or of parser positions) interned to an int; its row
is an int32[256] of successor states (-1 = dead), computed the first time someone asks. Rows
live in blocks of 64 that are never copied or moved (a table of all states would be copied
each time it grew, and a large automaton's growth copied megabytes in the middle of a mask),
handed out in the order rows are computed. `pointers` holds each computed row's
address (0 before), for the native trie walk (`native_walk`), which reads the rows where they
are.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Hashable
from typing import TypeVar

import numpy as np

from .budget import GrammarBudget
from .native_rows import dfa_rows

DICT_ENTRY_BYTES = 100  # a dict or set slot, its hash and key tuple, roughly
ROW_BYTES = np.empty(256, dtype=np.int32).nbytes + sys.getsizeof(np.empty(0)) + 8
POINTER_BYTES = 8
_BLOCK_ROWS = 64  # rows per block
_FIRST_POINTERS = 256  # room for this many states' row addresses before the array grows

K = TypeVar("K")


def untracked(key: K) -> K:
    """`key`, out of the cyclic collector's sight when it is a tuple of atoms (ints, None,
    strings and tuples of them): a dict stays out of it while every key and value put in it
    is, and the collector would otherwise walk an automaton's dicts of states at every full
    collection (it stops tracking such a tuple only once it has walked it)."""
    native = dfa_rows()
    return key if native is None else native.untracked(key)


class StateRows:
    """States by id (`sets`), ids by state, each state's row (None until computed) and the
    rows' addresses (`pointers`, int64, at least one per state; replaced as it grows)."""

    def __init__(self, budget: GrammarBudget, elements: str):
        self.budget = budget
        self.elements = elements  # what a state is a set of, for budget messages
        self.sets: list[Collection[Hashable]] = []
        self._ids: dict[Collection[Hashable], int] = {}
        # None until computed; (block, index) as the C trie walk leaves it, viewed on first read
        self._rows: list[np.ndarray | tuple[np.ndarray, int] | None] = []
        native = dfa_rows()
        if native is not None:  # tuples of ints and rows: no reference cycle runs through them
            native.untrack_lists(self.sets, self._rows)
        self.pointers = np.zeros(_FIRST_POINTERS, dtype=np.int64)
        budget.charge(self.pointers.nbytes)
        # per state, 1 where every string of text can be read from it (`Dfa.reads_any_text`);
        # grown ahead of walks (`reserve_any_text`), as the trie walk reads it where it is
        self.any_text = np.zeros(_FIRST_POINTERS, dtype=np.uint8)
        budget.charge(self.any_text.nbytes)
        self._block = np.empty((0, 256), dtype=np.int32)  # where the next rows go
        self._next = 0  # the next free row of `_block`
        self._address = 0  # of `_block`

    def __len__(self) -> int:
        return len(self.sets)

    def containers(self) -> list:
        """The lists and dict these states alone hold (see `reaper`)."""
        return [self.sets, self._ids, self._rows]

    def intern(self, key: Collection[Hashable], any_text: bool = False) -> int:
        """The id of state `key`, new ones within the budget; `any_text` marks a new one that
        reads every string of text."""
        got = self._ids.get(key)
        if got is None:
            self.budget.check("max_state_size", len(key), f"{self.elements} in one state")
            self.budget.check("max_states", len(self.sets) + 1, "automaton states")
            self.budget.charge(sys.getsizeof(key) + 2 * DICT_ENTRY_BYTES)
            got = self._ids[untracked(key)] = len(self.sets)
            self.sets.append(key)
            self._rows.append(None)
            if got == self.pointers.shape[0]:
                self.budget.charge(got * POINTER_BYTES)
                self.pointers = np.concatenate([self.pointers, np.zeros(got, dtype=np.int64)])
            if any_text:
                self.reserve_any_text(got + 1)
                self.any_text[got] = 1
        return got

    def reserve_any_text(self, num_states: int) -> np.ndarray:
        """`any_text`, with room for at least `num_states` states (twice that when it grows: a
        new array, so that a walk reading the one before still reads what it had)."""
        if self.any_text.shape[0] < num_states:
            grown = np.zeros(2 * num_states, dtype=np.uint8)
            grown[: self.any_text.shape[0]] = self.any_text
            self.budget.charge(grown.nbytes - self.any_text.nbytes)
            self.any_text = grown
        return self.any_text

    def row(self, state: int, fill: Callable[[int, np.ndarray], None]) -> np.ndarray:
        """The row of `state`, written by `fill(state, row)` into a fresh row of -1s the
        first time."""
        got = self._rows[state]
        if got is None:
            self.budget.check_time()
            if self._next == self._block.shape[0]:
                self._new_block()
            # taken before `fill` runs, so that a fill that fails leaves no half-written row
            # to the next state
            k = self._next
            self._next += 1
            got = self._block[k]
            got.fill(-1)
            fill(state, got)
            self._rows[state] = got
            self.budget.charge(ROW_BYTES)
            self.pointers[state] = self._address + k * self._block.strides[0]
        elif type(got) is tuple:  # (block, index): a row the C trie walk made (`dfa_rows.c`)
            block, k = got
            got = self._rows[state] = block[k]
        return got

    def _new_block(self) -> None:
        """The next rows go into a new block of `_BLOCK_ROWS`, left as allocated: each row is
        set to -1s as it is taken, so the pages of rows never taken are never touched (a
        small automaton's block costs the pages of its rows, not 64 KB)."""
        self._block = np.empty((_BLOCK_ROWS, 256), dtype=np.int32)
        self._next, self._address = 0, self._block.ctypes.data
