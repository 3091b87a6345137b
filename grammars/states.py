"""Interned automaton states and their lazily computed rows, counted against a grammar's budget.

A state is a hashable set (of NFA states, or of parser positions) interned to an int; its row
is an int32[256] of successor states (-1 = dead), computed the first time someone asks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Hashable

import numpy as np

from .budget import GrammarBudget

DICT_ENTRY_BYTES = 100  # a dict or set slot, its hash and key tuple, roughly


class StateRows:
    """States by id (`sets`), ids by state, and the row table."""

    def __init__(self, budget: GrammarBudget, elements: str):
        self.budget = budget
        self.elements = elements  # what a state is a set of, for budget messages
        self.sets: list[Collection[Hashable]] = []
        self._ids: dict[Collection[Hashable], int] = {}
        self.table = np.full((16, 256), -1, dtype=np.int32)
        self.done = np.zeros(16, dtype=bool)
        budget.charge(self.table.nbytes + self.done.nbytes)

    def __len__(self) -> int:
        return len(self.sets)

    def intern(self, key: Collection[Hashable]) -> int:
        """The id of state `key`, new ones within the budget."""
        got = self._ids.get(key)
        if got is None:
            self.budget.check("max_state_size", len(key), f"{self.elements} in one state")
            self.budget.check("max_states", len(self.sets) + 1, "automaton states")
            self.budget.charge(sys.getsizeof(key) + 2 * DICT_ENTRY_BYTES)
            if len(self.sets) == self.table.shape[0]:
                self._grow()
            got = self._ids[key] = len(self.sets)
            self.sets.append(key)
        return got

    def row(self, state: int, compute: Callable[[int], np.ndarray]) -> np.ndarray:
        """The row of `state`, from `compute(state)` the first time."""
        if not self.done[state]:
            self.budget.check_time()
            row = compute(state)
            self.table[state] = row  # after computing: interning may have reallocated the table
            self.done[state] = True
        return self.table[state]

    def _grow(self) -> None:
        grow = self.table.shape[0]
        self.budget.charge(grow * (self.table.itemsize * 256 + 1))
        self.table = np.vstack([self.table, np.full((grow, 256), -1, dtype=np.int32)])
        self.done = np.concatenate([self.done, np.zeros(grow, dtype=bool)])
