"""Walking a byte automaton over text, for the grammar automaton tests."""

from __future__ import annotations

from radixflow.grammars.automaton import ByteAutomaton


def walk(auto: ByteAutomaton, text: str) -> int:
    """State after `text`'s bytes, -1 once dead."""
    state = auto.initial
    for b in text.encode():
        state = int(auto.row(state)[b])
        if state < 0:
            break
    return state


def accepts(auto: ByteAutomaton, text: str) -> bool:
    """Does the automaton accept exactly `text`?"""
    state = walk(auto, text)
    return state >= 0 and auto.is_accepting(state)
