"""Walking a byte automaton over text, for the grammar automaton tests, and the tokens it
allows one token at a time (the reference the mask walks are compared with)."""

from __future__ import annotations

import numpy as np

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


def allowed_tokens(index, auto: ByteAutomaton, state: int) -> np.ndarray:
    """bool [vocab]: the tokens whose bytes all step from `state` without dying, and the EOS
    ids where `state` accepts; the automaton's rows are read once each."""
    allowed = np.zeros(index.num_words * 32, dtype=bool)
    rows: dict[int, list[int]] = {}
    for t, data in enumerate(index.token_bytes):
        s = state
        for b in data or b"":
            if s not in rows:
                rows[s] = auto.row(s).tolist()
            s = rows[s][b]
            if s < 0:
                break
        allowed[t] = bool(data) and s >= 0
    if auto.is_accepting(state):
        allowed[list(index.eos_ids)] = True
    return allowed


def without_lexer_pairs(monkeypatch) -> None:
    """Native trie walks that step through parser states only, not a grammar automaton's
    lexer rows as pairs (`dfa_rows.begin_walk` then hands the walk no lexer side)."""
    from radixflow.grammars import native_rows

    native = native_rows.dfa_rows()
    begin = native.begin_walk
    monkeypatch.setattr(native, "begin_walk", lambda *args: (begin(*args)[0], 0))
