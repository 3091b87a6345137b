"""Byte automata the matcher walks: a regex DFA, and the protocol grammar automata follow.

An automaton has int states (-1 = dead), an `initial` state, `row(s)` (int32[256] successors,
computed on first use), `row_pointers()` (each computed row's address, 0 before: the native
trie walk reads the rows in place) and `is_accepting(s)`. States are immutable facts about the
remaining language, so masks and forced text are cached per state. What it builds lazily counts against
its `budget` (see `budget`), which the compiled grammar binds to its limits.
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np

from .budget import GrammarBudget
from .nfa import NFA, Deadline, EmptyLanguage, LazyDFA, nfa_nbytes


class ByteAutomaton(Protocol):
    initial: int
    lock: threading.RLock
    budget: GrammarBudget

    def row(self, state: int) -> np.ndarray: ...

    def row_pointers(self) -> np.ndarray: ...

    def is_accepting(self, state: int) -> bool: ...

    def containers(self) -> list: ...

    def any_text(self, num_states: int) -> np.ndarray | None:
        """Per state, 1 where every string of JSON string text can be read from it, with room
        for at least `num_states` states; None where the automaton does not tell."""

    @property
    def native_rows(self) -> object | None:
        """What holds this automaton's rows where C computes them (a regex's `LazyDFA`, a
        grammar automaton itself): the C trie walk then makes a missing row itself instead
        of calling `row`."""


class RegexAutomaton:
    """Lazy DFA over the bytes of the strings a regex IR matches (its NFA is lazy too)."""

    def __init__(self, ir, deadline: Deadline | None = None):
        nfa = NFA(deadline)
        final = nfa.new_state()
        nfa.tags[final] = 0
        start = nfa.add(ir, final)
        self._final = final
        self.budget = GrammarBudget()
        self.budget.charge(nfa_nbytes(nfa))
        self.dfa = LazyDFA(nfa, self.budget)
        self.dfa.untrack_ir(ir)
        self.initial = self.dfa.intern([start])
        if self.initial < 0:
            raise EmptyLanguage("the grammar matches no text")
        self.lock = threading.RLock()

    def row(self, state: int) -> np.ndarray:
        return self.dfa.row(state)

    def row_pointers(self) -> np.ndarray:
        return self.dfa.states.pointers

    def containers(self) -> list:
        return self.dfa.containers()

    def any_text(self, num_states: int) -> np.ndarray:
        return self.dfa.states.reserve_any_text(num_states)

    @property
    def native_rows(self) -> LazyDFA | None:
        return self.dfa if self.dfa.native is not None else None

    def is_accepting(self, state: int) -> bool:
        return self._final in self.dfa.sets[state]
