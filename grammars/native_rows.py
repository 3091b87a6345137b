"""The lazy DFA's rows in C (`dfa_rows.c`, a Python extension module built on first use, see
`native_build`), with `nfa.LazyDFA`'s and `nfa.NFA`'s Python code as its twin.

A new row is the byte sweep of its NFA states' edges, the closure of each new target set and
the NFA states those make on the way (literal runs, character and lifted states, a sequence's
or an alternation's moves, a repeat's or an explicit DFA's counters); the C module does all of
it on the same lists and dicts and calls the same Python methods for the rest (IR facts a node
does not carry, a Dfa's spelled character class, limits and errors), so the automaton (its
NFA and DFA states, their numbers, every row) is the same either way. A grammar automaton's
parser rows (`cfg.GrammarAutomaton._compute_row`: its elements' lexer rows, their successors
and the interned unions) are made there too (`cfg_row`). It also holds the trie walk's row
callback (`begin_walk`, `end_walk`), which makes a missing row of either kind in C. Building it
needs the interpreter's C headers (`sysconfig`'s include path); without them the twin runs.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from types import ModuleType

from .native_build import load_extension

SOURCE = Path(__file__).with_name("dfa_rows.c")


@functools.cache
def dfa_rows() -> ModuleType | None:
    """The C module (`closure`, `fill_row`), or None (the Python twin) with the reason logged
    or warned once."""
    native = load_extension("lazy DFA rows", "automaton rows use the slower Python code", SOURCE)
    if native is not None:
        # A child has only the thread that forked: what the parent's other threads were
        # walking, filling or compiling (`reaper.busy`) is not running in it.
        os.register_at_fork(after_in_child=native.forget_running)
    return native


def describe() -> str:
    """Which code computes the lazy DFA's rows, for the startup log."""
    return "native rows" if dfa_rows() is not None else "Python rows"
