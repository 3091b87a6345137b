"""Interned automaton states and their lazily computed rows, counted against a grammar's budget.

A state is a hashable set (of NFA states, or of parser positions) interned to an int; its row
is an int32[256] of successor states (-1 = dead), computed the first time someone asks and
kept as its own array: a table of all states would be copied each time it grew, and a large
automaton's growth copied megabytes in the middle of a mask.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Hashable

import numpy as np

from .budget import GrammarBudget

DICT_ENTRY_BYTES = 100  # a dict or set slot, its hash and key tuple, roughly
ROW_BYTES = np.empty(256, dtype=np.int32).nbytes + sys.getsizeof(np.empty(0)) + 8


class StateRows:
    """States by id (`sets`), ids by state, and each state's row (None until computed)."""

    def __init__(self, budget: GrammarBudget, elements: str):
        self.budget = budget
        self.elements = elements  # what a state is a set of, for budget messages
        self.sets: list[Collection[Hashable]] = []
        self._ids: dict[Collection[Hashable], int] = {}
        self._rows: list[np.ndarray | None] = []

    def __len__(self) -> int:
        return len(self.sets)

    def intern(self, key: Collection[Hashable]) -> int:
        """The id of state `key`, new ones within the budget."""
        got = self._ids.get(key)
        if got is None:
            self.budget.check("max_state_size", len(key), f"{self.elements} in one state")
            self.budget.check("max_states", len(self.sets) + 1, "automaton states")
            self.budget.charge(sys.getsizeof(key) + 2 * DICT_ENTRY_BYTES)
            got = self._ids[key] = len(self.sets)
            self.sets.append(key)
            self._rows.append(None)
        return got

    def row(self, state: int, compute: Callable[[int], np.ndarray]) -> np.ndarray:
        """The row of `state`, from `compute(state)` (a new int32[256]) the first time."""
        got = self._rows[state]
        if got is None:
            self.budget.check_time()
            got = self._rows[state] = compute(state)
            self.budget.charge(ROW_BYTES)
        return got
